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

``--poll N`` hands the frames over as the worker's event loop does, ``N`` per poll
(``Worker.handle``: the backlog bookkeeping and the clock around each ``deliver``);
``--entries K`` puts ``K`` entries in each frame (a 64,000-byte frame holds about
five 100-row entries of ``forward.yaml``).

    python -m benchmarks.receive_path [--operator sequence_check] [--rows 100] [--both]
        [--poll 16] [--entries 5]
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
from typhoon.runtime.worker import Worker
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


def one_round(
    operator: str,
    frames: list[list[bytes]],
    src: int,
    columns: bool = False,
    poll: int = 0,
) -> float:
    """Seconds to deliver every frame (its entries) to a fresh worker of ``operator``:
    straight to ``Framework.deliver``, or ``poll`` frames at a time through the event
    loop's ``Worker.handle``.  RuntimeError if not every tuple reached the operator."""
    args = OPERATORS[operator]
    text = topology_text(operator, columns)
    topo = load_topology_text(text, "receive.yaml")
    phys = schedule(topo, ["h1"], 7)
    spec = WorkerSpec(topo, phys, phys.of_node("sink")[0].worker_id)
    if poll:
        worker = Worker(spec, NullIO())
        fw = worker.fw
        items: list[Inbound | ControlTuple] = [Inbound(src, 1, f) for f in frames]
        clock = time.monotonic
        t0 = time.perf_counter()
        for a in range(0, len(items), poll):
            worker.handle(items[a : a + poll], clock)
        took = time.perf_counter() - t0
    else:
        fw = Framework(spec, resolve_operator(operator)(**args), NullIO())
        t0 = time.perf_counter()
        for entries in frames:
            fw.deliver(Inbound(src, 1, entries))
        took = time.perf_counter() - t0
    sent = sum(Inbound(src, 1, f).count() for f in frames)
    if fw.proc_count != sent:
        raise RuntimeError(f"{fw.proc_count} of {sent} tuples reached the operator")
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--operator", choices=sorted(OPERATORS), default="sequence_check")
    ap.add_argument("--rows", type=int, default=100, help="rows per entry (the batch size)")
    ap.add_argument("--tuples", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--poll", type=int, default=0, help="frames per poll (0: deliver only)")
    ap.add_argument("--entries", type=int, default=1, help="entries per frame")
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
    frames: dict[bool, list[list[bytes]]] = {}
    for columns in modes:
        if columns:
            from typhoon.wire.layout import pack_block, parse_layout

            layout = parse_layout(
                load_topology_text(topology_text("collect", True)).streams[0].columns
            )
            entries = [pack_block(layout, b) or b"" for b in batches]
        else:
            entries = [encode_rows(b) for b in batches]
        k = args.entries
        frames[columns] = [entries[a : a + k] for a in range(0, len(entries), k)]
    us: dict[bool, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:
            s = one_round(args.operator, frames[m], src, m, args.poll)
            us[m].append(s / args.tuples * 1e6)
    how = f"{args.poll} frames per poll" if args.poll else "deliver only"
    for m in modes:
        print(
            f"{args.operator} {'columns' if m else 'rows'} rows/entry {args.rows} "
            f"entries/frame {args.entries}, {how}: "
            f"best {min(us[m]):.3f} µs/tuple, median {statistics.median(us[m]):.3f} "
            f"({args.rounds} rounds of {args.tuples:,})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
