"""Microseconds per emitted tuple on a split worker's send path, in one process.

The wordcount's split worker (``topologies/wordcount_chained.yaml``: 8 words per
sentence, fields grouping on ``word`` to 4 count workers) gets batches of
sentences the way its chained source hands them over (``Framework.deliver`` with
rows, no decoding) and each turn ends with ``flush``, as in the worker's event
loop: the operator, routing by word, batching per receiver and one msgpack call
per entry, without a TAP, a socket or the switch (the transport drops what it
is handed).  Each round runs ``--sentences`` sentences through a fresh worker;
the best and the median of ``--rounds`` are printed, per word.  ``--per-row``
takes the operator's row-by-row path (``process`` and ``emit`` per word) where
a batch path exists.  Run two checkouts alternately (``PYTHONPATH``) to compare
them on a loaded machine: the ratio is what to read.

    python benchmarks/emit_path.py [--chunk 256] [--per-row]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from typhoon.operators import resolve_operator
from typhoon.operators.sources import generate_sentences
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound, Transport
from typhoon.topology import Topology, load_topology, schedule
from typhoon.wire import ControlTuple

WORDCOUNT = Path(__file__).resolve().parents[1] / "topologies" / "wordcount.yaml"


def wordcount(count_parallelism: int = 4) -> Topology:
    """``topologies/wordcount.yaml`` with one split worker and ``count_parallelism`` counters."""
    topo = load_topology(WORDCOUNT)
    topo.nodes["split"].parallelism = 1
    topo.nodes["count"].parallelism = count_parallelism
    return topo


WORDS, VOCABULARY, SEED = 8, 500, 7


class NullIO(Transport):
    """A transport that delivers nothing and drops what is sent, counting the bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def poll(self, timeout: float) -> list[Inbound | ControlTuple]:
        return []

    def send(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        self.bytes += sum(map(len, payloads))

    def reply(self, ct: ControlTuple) -> None:
        pass


def one_round(batches: list[list[list[str]]], per_row: bool) -> tuple[float, int]:
    """Seconds to run every batch through a fresh split worker, and the words routed."""
    topo = wordcount()
    phys = schedule(topo, ["h1"], 7)
    src = phys.of_node("source")[0].worker_id
    split = phys.of_node("split")[0].worker_id
    fw = Framework(WorkerSpec(topo, phys, split), resolve_operator("split_words")(), NullIO())
    if per_row:
        fw._process_batch = None
        if hasattr(fw, "_process_rows"):
            fw._process_rows = None
    t0 = time.perf_counter()
    for rows in batches:
        fw.deliver(Inbound(src, 1, [], rows))
        fw.flush()
    fw.flush(force=True)
    return time.perf_counter() - t0, sum(r.emitted for r in fw.routers.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk", type=int, default=256, help="sentences per delivery")
    ap.add_argument("--sentences", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--per-row", action="store_true", help="process and emit row by row")
    args = ap.parse_args(argv)
    sentences = [[s] for s in generate_sentences(args.sentences, SEED, WORDS, VOCABULARY)]
    batches = [sentences[i : i + args.chunk] for i in range(0, len(sentences), args.chunk)]
    us = []
    for _ in range(args.rounds):
        seconds, words = one_round(batches, args.per_row)
        us.append(seconds / words * 1e6)
    mode = "per row" if args.per_row else "default"
    print(
        f"split -> fields x4, {args.chunk} sentences/delivery, {mode}: best {min(us):.3f} "
        f"µs/word, median {statistics.median(us):.3f} ({args.rounds} rounds of {words:,} words)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
