"""Time ``typhoon debug attach`` on an emulated cluster, from the command's start to its
first printed tuple, N times on one cluster (each attach a new session, so a new debug
worker process on the observed worker's host).

Run from a tree's root: ``PYTHONPATH=. python measure_attach.py OUT.json [N]``; it uses
only what the tree before and after the change share.  A wordcount's source sends 400
sentences/s for the whole measurement (split[0]'s output is watched).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from record import write_record

from benchmarks.scenarios.startup import WORDCOUNT
from mininet_env.fabric import FabricPlan
from mininet_env.run import SdnRunOptions, start_cluster
from typhoon.topology import load_topology_text
from typhoon.topology.model import Topology


def wordcount() -> Topology:
    """The start-up benchmark's wordcount (both trees have it) as ``dbgstart``: its source
    sends 400 of 1,000,000 sentences/s for the whole measurement, 2 count workers
    without the stateful flush."""
    t = load_topology_text(WORDCOUNT)
    t.name = "dbgstart"
    t.nodes["source"].args.update(count=1_000_000, rate=400)
    t.nodes["count"].parallelism = 2
    t.nodes["count"].stateful = False
    return t


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def stamp(line: str) -> float | None:
    m = LOG_TIME.match(line)
    if not m:
        return None
    return datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def agent_times(workdir: Path, sid: str) -> dict[str, float]:
    """Wall-clock times the agents logged for session ``sid``: worker started, port up."""
    out: dict[str, float] = {}
    for log in workdir.rglob("agent-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if f"debug session {sid}:" not in line:
                continue
            t = stamp(line)
            if t is None:
                continue
            if "started debug worker" in line:
                out["started"] = t
            elif " is port " in line:
                out["port"] = t
    return out


def first_frame(workdir: Path, sid: str) -> float | None:
    for log in workdir.rglob(f"{sid}.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "first mirrored frame" in line:
                return stamp(line)
    return None


def attach_once(url: str, token: str) -> dict[str, float | str]:
    env = {**os.environ, "TYPHOON_CONTROLLER": url, "TYPHOON_TOKEN": token}
    argv = [
        sys.executable,
        "-m",
        "typhoon_cli",
        "debug",
        "attach",
        "dbgstart",
        "split[0]",
        "--direction",
        "out",
        "--format",
        "json",
        "--count",
        "1",
        "--poll",
        "0.02",
    ]
    lines: list[tuple[float, str, str]] = []

    def read(stream, kind: str) -> None:
        for line in stream:
            lines.append((time.time(), kind, line.rstrip("\n")))

    t0 = time.time()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    threads = [
        threading.Thread(target=read, args=(proc.stdout, "out")),
        threading.Thread(target=read, args=(proc.stderr, "err")),
    ]
    for th in threads:
        th.start()
    rc = proc.wait(timeout=60)
    for th in threads:
        th.join()
    live = next((t for t, k, s in lines if k == "err" and " watching " in s), None)
    first = next((t for t, k, _ in lines if k == "out"), None)
    said = [s for _, k, s in lines if k == "err"]
    sid = next((m[1] for s in said if (m := re.match(r"session (\w+):", s))), "")
    if rc != 0 or first is None or live is None:
        raise RuntimeError(f"attach failed ({rc}): {lines}")
    return {"t0": t0, "session": sid, "live": live, "first": first, "exit": time.time()}


def main() -> int:
    out_path = Path(sys.argv[1]).resolve()
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    workdir = Path(f"/tmp/dbgfork-{os.getpid()}")
    options = SdnRunOptions(
        plan=FabricPlan(hosts=3, prefix=f"df{os.getpid() % 1000}"),
        apps=["apps/live_debugger.py"],
        live=False,
        workdir=workdir,
        timeout=600,
    )
    rows = []
    load = [os.getloadavg()[0]]
    cluster = start_cluster(options, sys.stderr)
    try:
        cluster.submit(wordcount())
        cluster.wait_active("dbgstart")
        time.sleep(2.0)
        for _ in range(n):
            load.append(os.getloadavg()[0])
            r = attach_once(cluster.rest_url, cluster.token)
            time.sleep(1.5)  # the session ends, its worker exits, the agent logs
            a = agent_times(workdir, str(r["session"]))
            ff = first_frame(workdir, str(r["session"]))
            started, port = a.get("started"), a.get("port")
            row = {
                "attach -> first tuple printed": r["first"] - r["t0"],
                "attach -> live": r["live"] - r["t0"],
                "attach -> debug worker started": started - r["t0"] if started else None,
                "debug worker started -> port up": port - started if port and started else None,
                "attach -> first frame": ff - r["t0"] if ff else None,
            }
            rows.append({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
            print(rows[-1], file=sys.stderr)
        cluster.kill("dbgstart")
    finally:
        cluster.close()
    write_record(out_path, rows, load=[round(x, 2) for x in load])
    return 0


if __name__ == "__main__":
    sys.exit(main())
