"""Microseconds per tuple on a forwarding source's send path, in one process.

``forward.yaml``'s source (``sequence_source``, msgpack row batches), the same with
``columns:`` declared on its stream (rows packed into column blocks at the sender),
and ``forward_columns.yaml``'s ``sequence_columns`` (numpy columns sent as blocks
by ``emit_columns``, no row built): a fresh worker per round runs its source to the
end as the event loop does (``step_spout``, ``flush``) into a transport that drops
what it is handed, with frames of ``--mtu`` bytes.  Best and median of ``--rounds``,
the three forms interleaved.  Timings here are one machine's, under its load.

    python benchmarks/source_path.py [--count 500000] [--rounds 5] [--mtu 64000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.emit_path import NullIO
from typhoon.operators import resolve_operator
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.topology import load_topology, schedule
from typhoon.wire import Control, ControlTuple

TOPOLOGIES = Path(__file__).resolve().parents[1] / "topologies"
COLUMNS = {"src": "int64", "seq": "int64", "ts": "float64", "payload": "bytes"}
FORMS = {
    "rows": ("forward.yaml", False),
    "rows packed as blocks": ("forward.yaml", True),
    "emit_columns": ("forward_columns.yaml", True),
}


def one_round(form: str, count: int, mtu: int) -> tuple[float, int]:
    """µs per tuple of one source run to its end, and the bytes it handed over."""
    file, declared = FORMS[form]
    topo = load_topology(TOPOLOGIES / file)
    topo.streams[0].columns = dict(COLUMNS) if declared else {}
    node = topo.nodes["source"]
    node.args["count"] = count
    phys = schedule(topo, ["h1"], 7)
    wid = phys.of_node("source")[0].worker_id
    io = NullIO()
    io.mtu = mtu
    op = resolve_operator(node.operator)(**node.args)
    fw = Framework(WorkerSpec(topo, phys, wid, batch_size=1000), op, io)
    fw.control(ControlTuple(Control.ACTIVATE, {}))
    t0 = time.perf_counter()
    while not fw.done:
        fw.now = time.monotonic()
        fw.step_spout()
        fw.flush()
    return (time.perf_counter() - t0) / count * 1e6, io.bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mtu", type=int, default=64_000)
    args = ap.parse_args()
    times: dict[str, list[float]] = {f: [] for f in FORMS}
    sizes: dict[str, int] = {}
    for _ in range(args.rounds):
        for form in FORMS:
            us, sent = one_round(form, args.count, args.mtu)
            times[form].append(us)
            sizes[form] = sent
    print(f"{args.count:,} tuples a round, {args.rounds} rounds, {args.mtu}-byte frames")
    for form, ts in times.items():
        print(
            f"  {form:24s} best {min(ts):.3f}  median {statistics.median(ts):.3f} µs/tuple, "
            f"{sizes[form] / args.count:.1f} bytes/tuple"
        )


if __name__ == "__main__":
    main()
