"""The run report: every worker's counters and each node's merged result.

Built from the report files workers write when they stop, so a tcp run and
an sdn run on emulated hosts produce the same document.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typhoon.operators import OperatorError, resolve_operator
from typhoon.operators.sinks import SequenceCheck
from typhoon.operators.sources import SequenceSource
from typhoon.topology.model import Node, Topology


def _is(node: Node, base: type) -> bool:
    """Is the node's operator ``base`` or a subclass of it?  By class, not by name, so
    that an operator extending ``sequence_check`` (a benchmark sink that also times
    arrivals) gets the same loss and duplicate accounting."""
    if node.engine != "python":
        return False
    try:
        return issubclass(resolve_operator(node.operator, node.engine), base)
    except OperatorError:
        return False


def read_worker_reports(report_dir: Path) -> list[dict[str, Any]]:
    reports = []
    for path in sorted(Path(report_dir).glob("worker-*.json")):
        reports.append(json.loads(path.read_text()))
    return sorted(reports, key=lambda r: r["worker"])


def _sequence_sources(topology: Topology, node: str) -> tuple[list[str] | None, bool]:
    """Sequence sources feeding ``node`` through pass-through (identity) nodes, and
    whether every last hop is an ``all`` grouping (each worker then expects every
    tuple).  None when a path filters, transforms or merges, so that the number of
    tuples to expect is not known."""
    sources: list[str] = []
    broadcast = True
    for s in topology.inputs_of(node):
        broadcast = broadcast and s.grouping.type == "all"
        src = topology.nodes[s.src]
        if _is(src, SequenceSource):
            sources.append(src.name)
        elif src.operator == "identity":
            upstream = _sequence_sources(topology, src.name)[0]
            if upstream is None:
                return None, broadcast
            sources.extend(upstream)
        else:
            return None, broadcast
    if len(set(sources)) != len(sources):
        return None, broadcast
    return sources, broadcast


def _sequence_check(
    topology: Topology,
    node: str,
    workers: list[dict[str, Any]],
    emitted_by_node: dict[str, dict[str, int]],
) -> dict[str, Any]:
    op = resolve_operator(topology.nodes[node].operator)
    results = [w["result"] for w in workers if w.get("result")]
    merged = op.merge_results(results) if results else {}
    sources, broadcast = _sequence_sources(topology, node)
    out = {k: v for k, v in merged.items() if k != "distinct"}
    if sources is None:
        out["missing"] = None
        return out
    emitted = {src: n for s in sources for src, n in emitted_by_node.get(s, {}).items()}
    if not sources or not results:
        out["missing"] = None
        return out
    if broadcast:
        # every worker must have every tuple: check each one on its own
        missing = 0
        per_worker = {}
        for w in workers:
            one = op.merge_results([w["result"]])
            m = sum(n - one["distinct"].get(src, 0) for src, n in emitted.items())
            per_worker[str(w["worker"])] = m
            missing += m
        out["missing"] = missing
        out["missing_per_worker"] = per_worker
        # the same tuple at two workers is the point of broadcast, not a duplicate
        out["duplicates"] = sum(w["result"]["duplicates"] for w in workers)
        out["expected"] = sum(emitted.values()) * len(workers)
    else:
        distinct = merged["distinct"]
        out["missing"] = sum(n - distinct.get(src, 0) for src, n in emitted.items())
        out["expected"] = sum(emitted.values())
    return out


def build_report(
    topology: Topology, worker_reports: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """Per-worker counters, per-node totals, and merged sink/source results."""
    by_node: dict[str, list[dict[str, Any]]] = {n: [] for n in topology.nodes}
    for r in worker_reports:
        by_node.setdefault(r["node"], []).append(r)
    emitted: dict[str, dict[str, int]] = {}
    for name, node in topology.nodes.items():
        if _is(node, SequenceSource):
            emitted[name] = {
                str(w["result"]["src"]): w["result"]["emitted"]
                for w in by_node[name]
                if w.get("result")
            }
    workers = []
    for r in worker_reports:
        m = r["metrics"]
        workers.append(
            {
                "worker": r["worker"],
                "node": r["node"],
                "index": r["index"],
                "host": r["host"],
                "port": r["port"],
                "finished": r["finished"],
                "error": r["error"],
                "cpu_s": r.get("cpu_s"),
                "in": m["in"],
                "out": m["out"],
                "drops": m["drops"],
                "seq_gaps": m["seq_gaps"],
                "serializations": m["serializations"],
                "frames_out": m["frames_out"],
                "credit_stalls": m["credit_stalls"],
            }
        )
    nodes: dict[str, Any] = {}
    results: dict[str, Any] = {}
    for name, node in topology.nodes.items():
        ws = by_node[name]
        nodes[name] = {
            "workers": len(ws),
            "tuples_in": sum(sum(w["metrics"]["in"].values()) for w in ws),
            "tuples_out": sum(sum(w["metrics"]["out"].values()) for w in ws),
        }
        if _is(node, SequenceCheck):
            results[name] = _sequence_check(topology, name, ws, emitted)
            continue
        rs = [w["result"] for w in ws if w.get("result") is not None]
        if rs:
            results[name] = resolve_operator(node.operator).merge_results(rs)
    return {
        "topology": topology.name,
        **extra,
        "workers": workers,
        "nodes": nodes,
        "results": results,
    }
