"""The topologies the paper's baseline experiments run, built as YAML and loaded as any file.

Going through the loader (not building the model by hand) checks them like a
user's topology: operators, fields, groupings.
"""

from __future__ import annotations

from typing import Any

import yaml

from typhoon.topology import Topology, load_topology_text

SOURCE = "sequence_source"
COLUMN_SOURCE = "sequence_columns"
SEQUENCE_COLUMNS = {"src": "int64", "seq": "int64", "ts": "float64", "payload": "bytes"}
SINK = "benchmarks.operators:BenchSink"
ACKING_SOURCE = "benchmarks.operators:AckingSource"
ACKER = "benchmarks.operators:Acker"
TIMED_COUNT = "benchmarks.operators:TimedCount"


def _load(doc: dict[str, Any]) -> Topology:
    return load_topology_text(yaml.safe_dump(doc, sort_keys=False), f"<{doc['name']}>")


def _source_args(size: int, rate: float, count: int | None) -> dict[str, Any]:
    args: dict[str, Any] = {"size": size}
    if rate:
        args["rate"] = rate
    if count is not None:
        args["count"] = count
    return args


def forwarding(
    name: str,
    size: int = 100,
    rate: float = 0.0,
    count: int | None = None,
    ack: bool = False,
    columns: bool = False,
) -> Topology:
    """Source -> sink (paper Fig. 8a, 8c/d); with ``ack``, plus Storm's acker (Fig. 8b);
    with ``columns``, the columnar source (``sequence_columns``) on a stream that
    declares its columns: blocks from the source's numpy columns to the sink's.

    Acked: the source sends each tuple's init to the acker, the sink acks each
    tuple to it.  The acker comes last in topological order, so the scheduler
    puts it on its own host when there are three.
    """
    doc: dict[str, Any] = {
        "name": name,
        "spouts": [
            {
                "id": "source",
                "operator": ACKING_SOURCE if ack else COLUMN_SOURCE if columns else SOURCE,
                "args": _source_args(size, rate, count),
            }
        ],
        "bolts": [{"id": "sink", "operator": SINK, "args": {"ack": True} if ack else {}}],
        "streams": [{"from": "source", "to": "sink", "grouping": "shuffle"}],
    }
    if columns:
        doc["streams"][0]["columns"] = dict(SEQUENCE_COLUMNS)
    if ack:
        doc["bolts"].append({"id": "acker", "operator": ACKER})
        doc["streams"] += [
            {"from": "source", "to": "acker", "stream": "ack_init", "grouping": "shuffle"},
            {"from": "sink", "to": "acker", "grouping": "shuffle"},
        ]
    return _load(doc)


def one_to_many(
    name: str, sinks: int, size: int = 100, count: int | None = None, cheap: bool = False
) -> Topology:
    """One source -> ``sinks`` sink workers, ``all`` grouping (paper Fig. 9); ``cheap``
    sinks check each batch by its ends (``BenchSink``), not row by row."""
    sink: dict[str, Any] = {"id": "sink", "operator": SINK, "parallelism": sinks}
    if cheap:
        sink["args"] = {"cheap": True}
    return _load(
        {
            "name": name,
            "spouts": [{"id": "source", "operator": SOURCE, "args": _source_args(size, 0, count)}],
            "bolts": [sink],
            "streams": [{"from": "source", "to": "sink", "grouping": "all"}],
        }
    )


def fan_in(name: str, sources: int = 6, size: int = 64, count: int | None = None) -> Topology:
    """``sources`` source workers -> one sink (shuffle): many senders into one receiver,
    over the fabric links into the sink's host (issue 11's first case)."""
    return _load(
        {
            "name": name,
            "spouts": [
                {
                    "id": "source",
                    "operator": SOURCE,
                    "args": _source_args(size, 0, count),
                    "parallelism": sources,
                }
            ],
            "bolts": [{"id": "sink", "operator": SINK}],
            "streams": [{"from": "source", "to": "sink", "grouping": "shuffle"}],
        }
    )


def diamond(name: str, size: int = 64, count: int | None = None) -> Topology:
    """Two sources through mixed groupings into two sink nodes (issue 11's diamond):

    s1 -fields-> a(3) -local_or_shuffle-> b(2) -all-> sink(3);
    s2 -shuffle-> d(2) -global-> sink2(1).
    """
    src = {"operator": SOURCE, "args": _source_args(size, 0, count)}
    return _load(
        {
            "name": name,
            "spouts": [{"id": "s1", **src}, {"id": "s2", **src}],
            "bolts": [
                {"id": "a", "operator": "identity", "parallelism": 3},
                {"id": "b", "operator": "identity", "parallelism": 2},
                {"id": "sink", "operator": SINK, "parallelism": 3},
                {"id": "d", "operator": "identity", "parallelism": 2},
                {"id": "sink2", "operator": SINK},
            ],
            "streams": [
                {"from": "s1", "to": "a", "grouping": {"type": "fields", "fields": ["seq"]}},
                {"from": "a", "to": "b", "grouping": "local_or_shuffle"},
                {"from": "b", "to": "sink", "grouping": "all"},
                {"from": "s2", "to": "d", "grouping": "shuffle"},
                {"from": "d", "to": "sink2", "grouping": "global"},
            ],
        }
    )


def relay_chain(
    name: str, size: int = 100, relay_us: float = 20.0, priority: bool = True, width: int = 2
) -> Topology:
    """Sources -> relays -> sink, ``width`` sources and relays, spread over the hosts
    (``placement: spread``: a node's workers alternate between hosts), so that data
    crosses every fabric link both ways.  A relay (``busy``) sleeps ``relay_us`` per
    tuple; ``priority`` false hands urgent control tuples out behind queued data
    (``sdn: {control_priority: false}``)."""
    return _load(
        {
            "name": name,
            "config": {"placement": "spread", "sdn": {"control_priority": priority}},
            "spouts": [
                {"id": "source", "operator": SOURCE, "args": {"size": size}, "parallelism": width}
            ],
            "bolts": [
                {
                    "id": "relay",
                    "operator": "busy",
                    "args": {"cost_us": relay_us},
                    "parallelism": width,
                },
                {"id": "sink", "operator": SINK},
            ],
            "streams": [
                {"from": "source", "to": "relay", "grouping": "shuffle"},
                {"from": "relay", "to": "sink", "grouping": "shuffle"},
            ],
        }
    )


def wordcount(
    name: str,
    count: int,
    seed: int = 7,
    words: int = 8,
    vocabulary: int = 500,
    splits: int = 2,
    counts: int = 4,
    chained: bool = False,
) -> Topology:
    """``topologies/wordcount.yaml`` (paper Fig. 2): source -> split (shuffle) -> count
    (fields on word), the count timing its arrivals (``TimedCount``).  ``chained``:
    ``topologies/wordcount_chained.yaml``'s shape instead, one source worker per split
    worker, source -> split ``forward`` (chained: one process each, docs/topology.md)."""
    doc = _wordcount_doc(name, count, seed, words, vocabulary, splits, counts)
    if chained:
        doc["spouts"][0]["parallelism"] = splits
        doc["streams"][0]["grouping"] = "forward"
    return _load(doc)


def _wordcount_doc(
    name: str, count: int, seed: int, words: int, vocabulary: int, splits: int, counts: int
) -> dict[str, Any]:
    return {
        "name": name,
        "spouts": [
            {
                "id": "source",
                "operator": "sentence_source",
                "args": {
                    "count": count,
                    "seed": seed,
                    "words": words,
                    "vocabulary": vocabulary,
                },
            }
        ],
        "bolts": [
            {"id": "split", "operator": "split_words", "parallelism": splits},
            {
                "id": "count",
                "operator": TIMED_COUNT,
                "args": {"key": "word"},
                "parallelism": counts,
            },
        ],
        "streams": [
            {"from": "source", "to": "split", "grouping": "shuffle"},
            {
                "from": "split",
                "to": "count",
                "grouping": {"type": "fields", "fields": ["word"]},
            },
        ],
    }
