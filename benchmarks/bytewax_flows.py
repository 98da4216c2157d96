"""The ``peers`` scenario's Bytewax side: one process of a Bytewax cluster, as a program.

``python -m benchmarks.bytewax_flows FLOW --proc-id I --addresses A;B --out F.json``
runs the dataflow ``FLOW`` as process ``I`` of the cluster at ``addresses``
(``bytewax.testing.cluster_main``: what ``python -m bytewax.testing -p N``
starts in each of its processes) and writes what this process saw to ``F.json``.
``benchmarks.bytewax_runs`` starts the processes and merges their files.

The data are the ones Typhoon's built-in spouts emit with the same arguments:

* ``forward``: ``[src, seq, ts, payload]`` tuples of ``size`` payload bytes
  (``sequence_source``), from one source partition, ``redistribute``d to
  every worker (a random worker per item: with two processes about half cross),
  into a sink that checks the sequence numbers and times the first and last
  arrival;
* ``wordcount``: the sentences of ``typhoon.operators.sources.generate_sentences``
  (``sentence_source``), one source partition, ``flat_map`` split into words,
  counted per word by ``fold_final`` (Bytewax exchanges by key before it), each
  fold step adding to this process's :class:`~benchmarks.arrivals.Arrivals`
  every ``SAMPLE`` words, as Typhoon's count adds each batch.

Bytewax pickles what crosses processes; it runs on the host (loopback), not
in an emulated host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.testing import cluster_main

from benchmarks.arrivals import Arrivals
from typhoon.operators.sources import generate_sentences

SAMPLE = 256  # fold steps between two clock reads (a batch of Typhoon's count is ~100)
FLOWS = ("forward", "wordcount")

# what this process saw; one process runs one worker (``-p N``, one worker each)
_seen: dict[str, Any] = {"emitted": 0, "source_here": False}
_arrivals = Arrivals()
_folds = [0]


class _IterPartition(StatefulSourcePartition[Any, int]):
    """Batches of ``batch`` items of an iterator; counts what it emitted."""

    def __init__(self, items: Iterator[Any], batch: int) -> None:
        self.items, self.batch = items, batch
        _seen["source_here"] = True

    def next_batch(self) -> list[Any]:
        out = [x for _, x in zip(range(self.batch), self.items, strict=False)]
        if not out:
            raise StopIteration
        _seen["emitted"] += len(out)
        return out

    def snapshot(self) -> int:
        return _seen["emitted"]


class _OnePartSource(FixedPartitionedSource[Any, int]):
    """One partition (Typhoon's source has parallelism 1), built on one worker."""

    def __init__(self, make: Any, batch: int) -> None:
        self.make, self.batch = make, batch

    def list_parts(self) -> list[str]:
        return ["0"]

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _IterPartition:
        return _IterPartition(self.make(), self.batch)


def sequence(count: int, size: int, batch: int) -> Iterator[list[Any]]:
    """``sequence_source``'s tuples: ``[0, seq, ts, payload]``, ts taken once a batch."""
    payload = b"x" * size
    for start in range(0, count, batch):
        now = time.time()
        yield from ([0, s, now, payload] for s in range(start, min(count, start + batch)))


class _SeqSinkPart(StatelessSinkPartition[Any]):
    def __init__(self, count: int) -> None:
        self.seen = bytearray(count)

    def write_batch(self, items: list[Any]) -> None:
        now = time.time()
        if not _seen.get("first_s"):
            _seen["first_s"] = now
        _seen["last_s"] = now
        seen, n = self.seen, len(self.seen)
        bad = 0
        for item in items:
            s = item[1]
            if 0 <= s < n:
                seen[s] = min(255, seen[s] + 1)
            else:
                bad += 1
        _seen["received"] = _seen.get("received", 0) + len(items)
        _seen["out_of_range"] = _seen.get("out_of_range", 0) + bad
        _seen["sink"] = self


class _SeqSink(DynamicSink[Any]):
    def __init__(self, count: int) -> None:
        self.count = count

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _SeqSinkPart:
        return _SeqSinkPart(self.count)


class _CountSinkPart(StatelessSinkPartition[Any]):
    def write_batch(self, items: list[Any]) -> None:
        counts = _seen.setdefault("counts", {})
        for word, n in items:
            counts[word] = counts.get(word, 0) + n


class _CountSink(DynamicSink[Any]):
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _CountSinkPart:
        return _CountSinkPart()


def _fold(acc: int, word: str) -> int:
    n = _folds[0] = _folds[0] + 1
    if n % SAMPLE == 0:
        _arrivals.add(SAMPLE)
    return acc + 1


def forward_flow(count: int, size: int, batch: int) -> Dataflow:
    flow = Dataflow("peers_forward")
    src = op.input("source", flow, _OnePartSource(lambda: sequence(count, size, batch), batch))
    moved = op.redistribute("redistribute", src)
    op.output("sink", moved, _SeqSink(count))
    return flow


def wordcount_flow(count: int, seed: int, words: int, vocabulary: int, batch: int) -> Dataflow:
    flow = Dataflow("peers_wordcount")
    source = _OnePartSource(lambda: generate_sentences(count, seed, words, vocabulary), batch)
    sentences = op.input("source", flow, source)
    split = op.flat_map("split", sentences, str.split)
    keyed = op.key_on("key", split, lambda w: w)
    counted = op.fold_final("count", keyed, int, _fold)
    op.output("out", counted, _CountSink())
    return flow


def result(flow: str) -> dict[str, Any]:
    """What this process saw, as JSON; the sequence bitmap as the seqs seen once, twice."""
    out: dict[str, Any] = {
        "flow": flow,
        "pid": os.getpid(),
        "emitted": _seen["emitted"],
        "source_here": _seen["source_here"],
    }
    if flow == "forward":
        sink = _seen.get("sink")
        out["received"] = _seen.get("received", 0)
        out["out_of_range"] = _seen.get("out_of_range", 0)
        out["first_s"], out["last_s"] = _seen.get("first_s"), _seen.get("last_s")
        # per sequence number how often it arrived here (hex: one byte each, capped at 255)
        out["seen_hex"] = bytes(sink.seen).hex() if sink is not None else ""
    else:
        # the fold steps this worker ran past the last full sample count too
        _arrivals.add(_folds[0] % SAMPLE)
        out["counts"] = _seen.get("counts", {})
        out["folds"] = _folds[0]
        out["arrivals"] = _arrivals.to_dict()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bytewax_flows")
    p.add_argument("flow", choices=FLOWS)
    p.add_argument("--proc-id", type=int, default=0)
    p.add_argument("--addresses", default="", help="host:port of every process, ';' between")
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--words", type=int, default=8)
    p.add_argument("--vocabulary", type=int, default=500)
    a = p.parse_args(argv)
    if a.flow == "forward":
        flow = forward_flow(a.count, a.size, a.batch)
    else:
        flow = wordcount_flow(a.count, a.seed, a.words, a.vocabulary, a.batch)
    addresses = [x for x in a.addresses.split(";") if x]
    t0 = time.time()
    cluster_main(flow, addresses, a.proc_id)
    out = result(a.flow)
    out["started_s"], out["ended_s"] = t0, time.time()
    Path(a.out).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
