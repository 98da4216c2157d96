"""Time an engine service (a Spark driver, ``python -m pyspark_bridge.driver PLAN``) from its
start to its ready file, started as the agent and the tcp runner start it
(``Supervised.start``), N times; and, in a fresh interpreter each, what its Python part
costs: the interpreter and ``import pyspark_bridge.driver`` (no JVM).

``PYTHONPATH=. python measure_engine.py OUT.json TOPOLOGY.yaml [N]`` from a tree's root.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import write_record

from typhoon.engines import plan_engines
from typhoon.supervised import Supervised
from typhoon.topology import load_topology
from typhoon.topology.scheduler import app_id_for, schedule


def one_start(topology_path: str) -> dict[str, float]:
    topology = load_topology(Path(topology_path))
    physical = schedule(topology, ["h1"], app_id_for(topology.name), first_port=0)
    with tempfile.TemporaryDirectory(prefix="engine-up-") as tmp:
        _, services = plan_engines(topology, physical, Path(tmp))
        s = services[0]
        t0 = time.monotonic()
        proc = Supervised.start(s.name, s.argv, Path(tmp) / f"{s.name}.log")
        try:
            while not Path(s.ready_file).exists():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"driver exited {proc.returncode}: "
                        + (Path(tmp) / f"{s.name}.log").read_text()[-2000:]
                    )
                if time.monotonic() - t0 > 120:
                    raise RuntimeError("no ready file in 120 s")
                time.sleep(0.02)
            up = time.monotonic() - t0
        finally:
            proc.stop(10.0)
    return {"driver up (start -> ready file)": round(up, 3)}


def python_part() -> dict[str, float]:
    code = (
        "import time, resource; t = time.perf_counter(); import pyspark_bridge.driver; "
        "r = resource.getrusage(resource.RUSAGE_SELF); "
        "print(time.perf_counter() - t, r.ru_utime + r.ru_stime)"
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall = time.monotonic() - t0
    imports, cpu = (float(x) for x in out.stdout.split())
    return {
        "interpreter + imports, wall": round(wall, 3),
        "imports, wall": round(imports, 3),
        "interpreter + imports, cpu": round(cpu, 3),
    }


def main() -> int:
    out_path = Path(sys.argv[1]).resolve()
    topology = sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    rows = []
    for _ in range(n):
        load = os.getloadavg()[0]
        rows.append({"load": round(load, 2), **one_start(topology), **python_part()})
        print(rows[-1], file=sys.stderr)
    write_record(out_path, rows, topology=topology)
    return 0


if __name__ == "__main__":
    sys.exit(main())
