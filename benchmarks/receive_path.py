"""Microseconds per tuple on a bolt's receive path, in one process, no transport.

``Framework.deliver`` gets frames of row-batch entries shaped like what
``topologies/forward.yaml``'s source sends (``[src, seq, ts, 100-byte payload]``,
``--rows`` per entry, consecutive sequence numbers) and hands them to a built-in
operator: the strict decoder, the framework's accounting and the operator's
``process_batch``, without a TAP, a socket or the switch.  Each round delivers
``--tuples`` tuples to a fresh worker; the best and the median of ``--rounds``
are printed.  Run two checkouts alternately (``PYTHONPATH``) to compare them on a
loaded machine: the ratio is what to read.

``--columns`` declares the stream's columns (docs/topology.md) and sends each
entry as a column block instead (``typhoon.wire.columns``): the operators with a
``process_columns`` get numpy columns.  ``--both`` interleaves rounds of the two in
one process and prints both (the comparison to read on a noisy machine).

    python -m benchmarks.receive_path [--operator sequence_check] [--rows 100] [--both]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from typhoon.operators import resolve_operator
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound, Transport
from typhoon.topology import load_topology_text, schedule
from typhoon.wire import ControlTuple, encode_rows

# operator -> its args in the topology (a filter as selective as Nexmark q2's)
OPERATORS: dict[str, dict[str, Any]] = {
    "sequence_check": {},
    "collect": {"limit": 1000},
    "filter": {"field": "seq", "modulo": 123, "equals": 0},
    "project": {"fields": ["seq", "ts"]},
}
COLUMNS = "{src: int64, seq: int64, ts: float64, payload: bytes}"

TOPOLOGY = """
name: receive
spouts:
  - id: source
    operator: sequence_source
    args: {{count: 10}}
bolts:
  - id: sink
    operator: {operator}
    args: {args}
streams:
  - from: source
    to: sink
    grouping: shuffle{columns}
"""


class NullIO(Transport):
    """A transport that delivers nothing and drops what is sent (the sink sends nothing
    but a filter's passing rows)."""

    def poll(self, timeout: float) -> list[Inbound | ControlTuple]:
        return []

    def send(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        pass

    def reply(self, ct: ControlTuple) -> None:
        pass


def topology_text(operator: str, columns: bool) -> str:
    args = OPERATORS[operator]
    declared = f"\n    columns: {COLUMNS}" if columns else ""
    return TOPOLOGY.format(operator=operator, args=args or "{}", columns=declared)


def one_round(operator: str, frames: list[bytes], src: int, columns: bool = False) -> float:
    """Seconds to deliver every frame to a fresh worker of ``operator``."""
    args = OPERATORS[operator]
    text = topology_text(operator, columns)
    topo = load_topology_text(text, "receive.yaml")
    phys = schedule(topo, ["h1"], 7)
    sink = phys.of_node("sink")[0].worker_id
    op = resolve_operator(operator)(**args)
    fw = Framework(WorkerSpec(topo, phys, sink), op, NullIO())
    t0 = time.perf_counter()
    for entry in frames:
        fw.deliver(Inbound(src, 1, [entry]))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--operator", choices=sorted(OPERATORS), default="sequence_check")
    ap.add_argument("--rows", type=int, default=100, help="rows per entry (the batch size)")
    ap.add_argument("--tuples", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--columns", action="store_true", help="entries as column blocks")
    mode.add_argument("--both", action="store_true", help="rows and columns, interleaved")
    args = ap.parse_args(argv)
    topo = load_topology_text(topology_text("collect", False), "r.yaml")
    src = schedule(topo, ["h1"], 7).of_node("source")[0].worker_id
    now, payload = time.time(), b"x" * 100
    batches = [
        [[src, s, now, payload] for s in range(a, min(a + args.rows, args.tuples))]
        for a in range(0, args.tuples, args.rows)
    ]
    modes = [False, True] if args.both else [args.columns]
    frames: dict[bool, list[bytes]] = {}
    for columns in modes:
        if columns:
            from typhoon.wire.layout import pack_block, parse_layout

            layout = parse_layout(
                load_topology_text(topology_text("collect", True)).streams[0].columns
            )
            frames[True] = [pack_block(layout, b) or b"" for b in batches]
        else:
            frames[False] = [encode_rows(b) for b in batches]
    us: dict[bool, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:
            us[m].append(one_round(args.operator, frames[m], src, m) / args.tuples * 1e6)
    for m in modes:
        print(
            f"{args.operator} {'columns' if m else 'rows'} rows/entry {args.rows}: "
            f"best {min(us[m]):.3f} µs/tuple, median {statistics.median(us[m]):.3f} "
            f"({args.rounds} rounds of {args.tuples:,})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
