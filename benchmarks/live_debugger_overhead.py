"""Paper Fig. 12 / Table 5: what watching a worker costs the application.

Two runs of source -> sink (100-byte tuples, as fast as the source can) on 3
emulated hosts, in three phases (before, attached, after):

* ``mirror``: the live debugger watches the source's output during the middle
  phase; the switch copies the frames, the source does nothing extra;
* ``provisioned``: the Storm-like way, a debug consumer deployed with the
  topology on a second stream (the source serializes and sends every tuple
  twice, all the time).

Per phase: the sink's throughput (median of 1-second samples) and the source
process's CPU time per 1000 tuples it emitted.  On a shared machine the first
moves with everything else that runs; the second is the source's own work and
shows what the debugger adds to it.  Also the source's serializations and
frames per tuple over the run.

Needs root (Mininet, OVS): ``sudo .venv/bin/python benchmarks/live_debugger_overhead.py``;
``--out F`` also writes every sample as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import time
from pathlib import Path

from mininet_env.fabric import FabricPlan
from mininet_env.run import EmulatedCluster, SdnRunOptions
from typhoon.topology import load_topology_text

MIRROR = """
name: dbgmirror
spouts:
  - {id: source, operator: sequence_source, args: {size: 100}}
bolts:
  - {id: sink, operator: sequence_check}
streams:
  - {from: source, to: sink, grouping: shuffle}
"""

PROVISIONED = """
name: dbgprov
spouts:
  - {id: source, operator: sequence_source, args: {size: 100}}
bolts:
  - {id: sink, operator: sequence_check}
  - {id: debug, operator: collect, args: {limit: 1000}}
streams:
  - {from: source, to: sink, grouping: shuffle}
  - {from: source, to: debug, grouping: shuffle}
"""

PHASES = ("before", "attached", "after")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (from /proc, so it works for any child of any agent)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker(c: EmulatedCluster, name: str, node: str) -> tuple[int, int]:
    """(worker id, pid) of a node's first worker."""
    wid = c.coordinator.get_physical(name).of_node(node)[0].worker_id
    return wid, c.coordinator.worker_statuses(name)[wid].pid


def counter(c: EmulatedCluster, name: str, wid: int, key: str, after: float) -> tuple[float, int]:
    """(metrics time, tuples in or out) of a worker from a METRIC_RESP newer than ``after``."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = c.coordinator.get_metrics(name).get(wid)
        if m and m["time"] > after:
            return m["time"], sum(v for k, v in m[key].items() if k == "1" or key == "in")
        time.sleep(0.05)
    raise TimeoutError(f"no fresh metrics of worker {wid}")


def run(c: EmulatedCluster, text: str, args: argparse.Namespace, debug: bool) -> dict:
    topology = load_topology_text(text, "bench")
    name = topology.name
    c.submit(topology)
    c.wait_active(name)
    source, pid = worker(c, name, "source")
    sink, _ = worker(c, name, "sink")
    bounds = [2.0, args.attach_at, args.detach_at, args.seconds]
    marks: list[tuple[float, int]] = []  # (source CPU s, source tuples out) at each bound
    samples: list[tuple[float, float]] = []  # (second, sink tuples/s)
    debug_stats: dict = {}
    start = time.monotonic()
    try:
        last = counter(c, name, sink, "in", time.time())
        for i, bound in enumerate(bounds):
            while (t := time.monotonic() - start) < bound:
                time.sleep(1.0)
                now = counter(c, name, sink, "in", last[0])
                samples.append((round(t, 1), (now[1] - last[1]) / (now[0] - last[0])))
                last = now
            marks.append((cpu_seconds(pid), counter(c, name, source, "out", time.time())[1]))
            if debug and i == 1:
                body = {"worker": "source", "direction": "out", "sample": args.sample}
                status, reply = c.rest("POST", f"/apps/{name}/debug", body)
                assert status == 201, reply
                session = reply["session"]
            if debug and i == 2:
                debug_stats = c.rest("DELETE", f"/apps/{name}/debug/{session}")[1]["stats"]
        metrics = c.coordinator.get_metrics(name)[source]
    finally:
        c.kill(name)
    emitted = metrics["out"]["1"]
    result: dict = {"samples": samples, "debugger": debug_stats}
    for phase, (lo, hi), (m0, m1) in zip(
        PHASES,
        zip(bounds, bounds[1:], strict=False),
        zip(marks, marks[1:], strict=False),
        strict=True,
    ):
        xs = [v for t, v in samples if lo + 1 <= t <= hi]
        result[phase] = {
            "sink_tuples_per_s": round(statistics.median(xs)) if xs else 0,
            "source_cpu_ms_per_1000": round(1e6 * (m1[0] - m0[0]) / max(1, m1[1] - m0[1]), 2),
        }
    result["serializations_per_tuple"] = round(metrics["serializations"] / emitted, 3)
    result["frames_per_1000_tuples"] = round(1000 * metrics["frames_out"] / emitted, 2)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=45)
    p.add_argument("--attach-at", type=float, default=15)
    p.add_argument("--detach-at", type=float, default=30)
    p.add_argument("--sample", type=float, default=1.0, help="percent the debugger keeps")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    options = SdnRunOptions(
        plan=FabricPlan(hosts=3, shape="mesh", prefix=f"ty{secrets.token_hex(2)}o"),
        apps=["apps/live_debugger.py"],
        live=False,
        controller_config="metrics_interval = 0.5\n",
    )
    cluster = EmulatedCluster(options)
    try:
        cluster.start()
        result = {
            "mirror": run(cluster, MIRROR, args, debug=True),
            "provisioned": run(cluster, PROVISIONED, args, debug=False),
        }
    finally:
        cluster.close()
    for kind, r in result.items():
        phases = "  ".join(
            f"{ph}: {r[ph]['sink_tuples_per_s']:>7}/s {r[ph]['source_cpu_ms_per_1000']:>5} ms"
            for ph in PHASES
        )
        print(
            f"{kind:11} {phases}  | serializations/tuple {r['serializations_per_tuple']}, "
            f"frames/1000 tuples {r['frames_per_1000_tuples']}"
        )
    stats = result["mirror"]["debugger"]
    print(f"debug worker: {stats.get('tuples')} tuples decoded, {stats.get('cpu_s')} CPU s")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
