"""The run report: every worker's counters, each node's merged result, and a verdict.

Built from the report files workers write when they stop, so a tcp run and
an sdn run on emulated hosts produce the same document.

The verdict (``ok``, ``problems``) does not trust any single counter: every
worker counts the tuples it sent on each link (receiver, stream) and the tuples
it received on each link (sender, stream), and :func:`link_problems` compares
the two ends of every link.  A run with a tuple missing or duplicated on any
link, a sequence check that found one, or a frame the transport had to write
off is not ok, and each problem is one sentence naming the link.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typhoon.operators import OperatorError, resolve_operator
from typhoon.operators.sinks import SequenceCheck
from typhoon.operators.sources import SequenceSource
from typhoon.topology.model import Node, Topology, WorkerAssignment

# event time (docs/windows.md): a worker's watermark and what its windows dropped
WATERMARK_METRICS = (
    "watermark",
    "watermark_closed",
    "watermark_idle",
    "watermark_bad_time",
    "window_bad_time",
    "window_bad_value",
    "window_late",
)


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
    """Sequence sources feeding ``node`` through pass-through (identity, emitting busy) nodes, and
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
        elif src.operator == "identity" or (
            src.operator == "busy" and (src.args or {}).get("emit", True) is not False
        ):  # pass-through nodes: every tuple goes on as it came
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


def _name(w: dict[str, Any]) -> str:
    return f"worker {w['worker']} ({w['node']}[{w['index']}])"


def _pairs(counts: dict[str, int]) -> dict[tuple[int, int], int]:
    """``{"7:2": n}`` -> ``{(7, 2): n}``."""
    out = {}
    for key, n in counts.items():
        a, _, b = key.partition(":")
        out[(int(a), int(b))] = int(n)
    return out


def link_problems(worker_reports: list[dict[str, Any]], recovered: Any = ()) -> list[str]:
    """One sentence per link whose two ends disagree, or whose transport lost frames.

    Frames written off to a ``recovered`` worker (dead, replaced, and the job rolled
    back to a checkpoint under a guarantee) were replayed: they are not a loss.

    Tuples sent to a node's load-balancer address (``sdn`` grouping through the
    switch) have no known receiver: they are checked per (sender, stream), against
    what every receiver got from that sender on that stream.
    """
    by_id = {w["worker"]: w for w in worker_reports}
    sent: dict[tuple[int, int, int], int] = {}  # (sender, receiver, stream) -> tuples
    got: dict[tuple[int, int, int], int] = {}
    balanced: dict[tuple[int, int], int] = {}  # (sender, stream) -> tuples to the LB address
    problems: list[str] = []
    for w in worker_reports:
        links = w.get("links")
        if links is None:
            continue
        me = w["worker"]
        for (dst, sid), n in _pairs(links.get("out", {})).items():
            sent[(me, dst, sid)] = n
        for (src, sid), n in _pairs(links.get("in", {})).items():
            got[(src, me, sid)] = n
        for sid, n in links.get("balanced_out", {}).items():
            balanced[(me, int(sid))] = int(n)
        t = links.get("transport", {})
        for dst, n in sorted(t.get("lost_to", {}).items()):
            if int(dst) in recovered:
                continue
            peer = by_id.get(int(dst))
            who = _name(peer) if peer else f"worker {dst}"
            problems.append(f"{_name(w)} -> {who}: {n} frames written off (receiver silent)")
        for dst, n in sorted(t.get("unconfirmed", {}).items()):
            if int(dst) in recovered:
                continue
            peer = by_id.get(int(dst))
            who = _name(peer) if peer else f"worker {dst}"
            problems.append(f"{_name(w)} -> {who}: {n} frames never confirmed at the end")
        if t.get("open_gaps"):
            problems.append(f"{_name(w)}: {t['open_gaps']} frames still missing at the end")
        if t.get("lb_lost"):
            problems.append(f"{_name(w)}: {t['lb_lost']} load-balanced frames lost")

    def missing(name: str, n_sent: int, n_got: int) -> str:
        what = f"{n_sent - n_got} missing" if n_got < n_sent else f"{n_got - n_sent} duplicated"
        return f"{name}: {n_sent} tuples sent, {n_got} received ({what})"

    lb_keys = set(balanced)
    for key in sorted(set(sent) | set(got)):
        s, r, sid = key
        if (s, sid) in lb_keys:
            continue
        if s not in by_id or r not in by_id:
            continue  # an end left no report: the run failed already (a worker died)
        if by_id[s].get("links") is None or by_id[r].get("links") is None:
            continue
        n_sent, n_got = sent.get(key, 0), got.get(key, 0)
        if n_sent != n_got:
            link = f"{_name(by_id[s])} -> {_name(by_id[r])} stream {sid}"
            problems.append(missing(link, n_sent, n_got))
    for (s, sid), n_lb in sorted(balanced.items()):
        n_sent = n_lb + sum(n for (a, _, b), n in sent.items() if a == s and b == sid)
        n_got = sum(n for (a, _, b), n in got.items() if a == s and b == sid)
        if n_sent != n_got and s in by_id:
            problems.append(missing(f"{_name(by_id[s])} -> stream {sid} (balanced)", n_sent, n_got))
    return problems


def log_traceback(path: Path, lines: int = 12) -> list[str]:
    """The last lines of the last Python traceback in a worker's log (empty if none):
    how a worker that died before writing its report (or without a traceback in it) ended."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return []
    return [line for line in text[start:].splitlines() if line.strip()][-lines:]


def worker_failures(
    assignments: list[WorkerAssignment],
    exit_codes: dict[int, int | None],
    worker_reports: list[dict[str, Any]],
    log_of: Any = None,
    tracebacks: dict[int, list[str]] | None = None,
) -> list[dict[str, Any]]:
    """Every worker that exited non-zero or reported an error: who (worker, node, index,
    host), how (exit code, error) and the last lines of its traceback, from its report or
    else from ``tracebacks`` (read on the worker's host by its agent) or else from its log
    (``log_of(worker_id)`` -> path; with ``tracebacks`` the log is on another host)."""
    reports = {r["worker"]: r for r in worker_reports}
    out = []
    for w in sorted(assignments, key=lambda w: w.worker_id):
        wid = w.worker_id
        code = exit_codes.get(wid)
        r = reports.get(wid, {})
        if not code and not r.get("error"):
            continue
        tb = list(r.get("traceback") or []) or list((tracebacks or {}).get(wid) or [])
        log = str(log_of(wid)) if log_of is not None else None
        if not tb and log and tracebacks is None:
            tb = log_traceback(Path(log))
        error = r.get("error") or (tb[-1] if tb else None)
        out.append(
            {
                "worker": wid,
                "node": w.node,
                "index": w.index,
                "host": w.host,
                "exit_code": code,
                "error": error,
                "traceback": tb,
                "log": log,
            }
        )
    # the worker that raised first: the others often only lost their connection to it
    out.sort(key=lambda f: (not f["traceback"], f["worker"]))
    return out


def failure_problems(failures: list[dict[str, Any]]) -> list[str]:
    """One sentence per failed worker."""
    out = []
    for f in failures:
        code = "" if f["exit_code"] is None else f" (exit code {f['exit_code']})"
        why = f": {f['error']}" if f["error"] else ""
        out.append(f"{_name(f)} on {f['host']} failed{code}{why}")
    return out


def result_problems(results: dict[str, Any]) -> list[str]:
    """Sequence checks that found tuples missing or duplicated.

    Only sinks whose every input path is a chain of pass-through nodes from
    distinct sequence sources know what to expect (``missing`` is not None); a sink
    that two paths reach gets some tuples twice by design.
    """
    out = []
    for node, r in sorted(results.items()):
        if not isinstance(r, dict) or "duplicates" not in r or r.get("missing") is None:
            continue
        if r["missing"]:
            out.append(f"sink {node}: {r['missing']} tuples missing of {r.get('expected')}")
        if r["duplicates"]:
            out.append(f"sink {node}: {r['duplicates']} tuples duplicated")
    return out


def restored_epochs(metrics: dict[str, Any]) -> list[int]:
    """The epoch of each restore of a worker, in order (-1: from the start), from its
    metrics' ``restored_epochs`` (restore number -> epoch)."""
    return [
        e for _, e in sorted((int(k), e) for k, e in metrics.get("restored_epochs", {}).items())
    ]


HANDLED = ("rejoined", "rerouted", "finished")  # incident states that ended as intended


def incident_problems(incidents: list[dict[str, Any]]) -> list[str]:
    """One sentence per incident (a worker that died mid-run) that was not handled to its
    end: its replacement failed, or the run ended in the middle of it.

    A handled incident is no problem by itself: what it cost is judged like any other
    loss, on the links and the sinks (a job without a guarantee loses what the dead
    worker held, and that fails the run there).  The frames its senders still wrote
    to the dead worker's address are listed with it (``dropped``), not as problems."""
    out = []
    for i in incidents:
        if i.get("state") in HANDLED:
            continue
        why = f": {i['detail']}" if i.get("detail") else ""
        out.append(
            f"worker {i.get('worker')} ({i.get('node')}) died ({i.get('reason')}) and was not "
            f"recovered (state {i.get('state')}){why}"
        )
    return out


def build_report(
    topology: Topology, worker_reports: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """Per-worker counters, per-node totals, merged sink/source results, and the
    verdict: ``ok`` is False when the caller says so (``ok=False``: a worker failed),
    when any link or sink shows a loss, or when an incident (``incidents=``: workers
    that died mid-run) was not recovered; ``problems`` says where.  Exact results
    after handled incidents are ok: the incidents are listed, with what they cost."""
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
                **({"moved_to": r["moved_to"]} if r.get("moved_to") else {}),  # typhoon move
                # operators swapped out in place: which, and what they took and gave
                **(
                    {"swapped": [{k: v for k, v in s.items() if k != "result"} for s in sw]}
                    if (sw := r.get("swapped"))
                    else {}
                ),
                "in": m["in"],
                "out": m["out"],
                "drops": m["drops"],
                "seq_gaps": m["seq_gaps"],
                "retransmitted": m.get("retransmitted", 0),
                "serializations": m["serializations"],
                "frames_out": m["frames_out"],
                "credit_stalls": m["credit_stalls"],
                # with a guarantee: the epoch of each restore (-1: from the start) and the
                # offset a source replayed from, so a recovery without a checkpoint shows
                **(
                    {
                        "restored_epochs": restored_epochs(m),
                        "replayed_from": m.get("replayed_from"),
                    }
                    if "restored_epochs" in m
                    else {}
                ),
                # a stream that declares columns: rows that came in column blocks, rows sent
                # as row batches because they did not fit its layout (docs/topology.md)
                # and what a columnar emit sent as blocks, and as rows (why)
                **{
                    k: m[k]
                    for k in ("columns_in", "columns_unfit", "columns_out", "columns_as_rows")
                    if m.get(k)
                },
                # keyed state: key groups owned, keys held, the last migration's figures
                **({"keyed": m["keyed"]} if "keyed" in m else {}),
                **{k: m[k] for k in WATERMARK_METRICS if k in m},
                # key-pair statistics (config: locality), for locality-aware routing
                **(
                    {"pairs": m["pairs"], "pairs_sampled": m["pairs_sampled"]}
                    if "pairs" in m
                    else {}
                ),
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
        # an operator swapped out in place (SWAP) reports like a drained worker
        rs += [s["result"] for w in ws for s in w.get("swapped") or () if s.get("result")]
        if rs:
            results[name] = resolve_operator(node.operator).merge_results(rs)
    recovered = set(extra.get("recovered") or ())
    failures = extra.pop("failures", [])
    problems = failure_problems(failures) + incident_problems(extra.get("incidents") or [])
    problems += link_problems(worker_reports, recovered) + result_problems(results)
    problems += extra.pop("switch_problems", []) + extra.pop("problems", [])
    ok = bool(extra.pop("ok", True)) and not problems
    return {
        "topology": topology.name,
        "ok": ok,
        "problems": problems,
        **({"failures": failures} if failures else {}),
        **extra,
        "workers": workers,
        "nodes": nodes,
        "results": results,
    }


def summary_lines(report: dict[str, Any]) -> list[str]:
    """Problems, the failed workers' tracebacks, and one line per node's result."""
    lines = [f"  problem: {problem}" for problem in report.get("problems", [])]
    for f in report.get("failures", []):
        if not f["traceback"]:
            continue
        where = f" (log: {f['log']})" if f.get("log") else ""
        lines.append(f"  worker {f['worker']} ({f['node']}[{f['index']}]) on {f['host']}{where}:")
        lines += [f"    | {line}" for line in f["traceback"]]
    for node, result in report["results"].items():
        if not isinstance(result, dict):
            continue
        hidden = ("counts", "tuples", "timeline", "max")
        brief = {k: v for k, v in result.items() if k not in hidden}
        if "max" in result:
            brief["keys"] = len(result["max"])
        if "counts" in result:
            brief["keys"] = len(result["counts"])
            brief["total"] = sum(result["counts"].values())
        lines.append(f"  {node}: {json.dumps(brief)}")
    return lines
