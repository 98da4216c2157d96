"""``typhoon control NAME NODE``: the paper's Table 2 control tuples from the command line.

``--input-rate N`` (tuples/s, 0 = unlimited), ``--batch-size N [--max-delay-ms MS]``,
``--activate``, ``--deactivate`` and ``--metrics`` send INPUT_RATE, BATCH_SIZE,
ACTIVATE, DEACTIVATE and METRIC_REQ to every worker of NODE through ``POST
/typhoon/apps/NAME/control``.  A setting is then confirmed: the verb asks the workers
for their metrics (METRIC_REQ) until each reports the new value (``rate``,
``batch_size`` and ``max_delay_ms``, ``active``) and exits 1 if one has not within
``--timeout`` (``--no-wait``: once the controller sent it).  ``--metrics`` prints
what each worker answered.  INPUT_RATE, ACTIVATE and DEACTIVATE are for spouts: the
controller refuses them for a bolt (exit 2, one sentence why).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, TextIO

from typhoon.client import Client
from typhoon_cli.ctl_verb import UsageError, VerbFailed, client_of, json_result

POLL_S = 0.1
ASK_AGAIN_S = 1.0  # a METRIC_REQ unanswered this long is asked again (a frame may be lost)


def control_body(args: argparse.Namespace, current_delay: float | None) -> tuple[str, dict]:
    """(type, body) of the control tuple the flags ask for."""
    if args.input_rate is not None:
        if not args.input_rate >= 0:
            raise UsageError("--input-rate takes tuples per second >= 0 (0: unlimited)")
        return "INPUT_RATE", {"rate": float(args.input_rate)}
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise UsageError("--batch-size takes a number of tuples >= 1")
        delay = args.max_delay_ms if args.max_delay_ms is not None else current_delay
        if delay is None:
            raise UsageError(
                "--batch-size: give --max-delay-ms too (the workers of this node have not "
                "reported theirs yet, or they differ)"
            )
        if not delay >= 0:
            raise UsageError("--max-delay-ms takes milliseconds >= 0")
        return "BATCH_SIZE", {"size": args.batch_size, "max_delay_ms": float(delay)}
    if args.activate:
        return "ACTIVATE", {}
    if args.deactivate:
        return "DEACTIVATE", {}
    return "METRIC_REQ", {}


def expected(kind: str, body: dict) -> dict[str, Any]:
    """What a worker's metrics say once it obeyed the control tuple."""
    if kind == "INPUT_RATE":
        return {"rate": body["rate"]}
    if kind == "BATCH_SIZE":
        return {"batch_size": body["size"], "max_delay_ms": body["max_delay_ms"]}
    if kind == "ACTIVATE":
        return {"active": 1}
    if kind == "DEACTIVATE":
        return {"active": 0}
    return {}


def obeyed(metrics: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(metrics.get(k) == v for k, v in want.items())


def _current_delay(client: Client, name: str, node: str) -> float | None:
    """The max delay the node's workers last reported, if they all agree."""
    reports = client.call("GET", f"/apps/{name}/metrics")
    delays = {m.get("max_delay_ms") for m in reports.values() if m.get("node") == node}
    return delays.pop() if len(delays) == 1 and None not in delays else None


def ask_metrics(
    client: Client, name: str, node: str, workers: list[int], timeout: float
) -> dict[int, dict[str, Any]]:
    """METRIC_REQ to ``node`` until each of ``workers`` answered one (or ``timeout``)."""
    got: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while True:
        reply = client.call("POST", f"/apps/{name}/control", {"type": "METRIC_REQ", "node": node})
        rid = reply["request_id"]
        asked = time.monotonic()
        while time.monotonic() - asked < ASK_AGAIN_S:
            answers = client.call("GET", f"/apps/{name}/responses/{rid}")
            got.update({int(w): m for w, m in answers.items() if int(w) in workers})
            if set(workers) <= set(got) or time.monotonic() > deadline:
                return got
            time.sleep(POLL_S)


def confirm(
    client: Client, name: str, node: str, workers: list[int], want: dict, timeout: float
) -> tuple[dict[int, dict], list[int]]:
    """Ask until every worker's metrics show ``want``; (last metrics, workers that never did)."""
    deadline = time.monotonic() + timeout
    last: dict[int, dict] = {}
    done: set[int] = set()
    while True:
        left = [w for w in workers if w not in done]
        fresh = ask_metrics(client, name, node, left, max(0.0, deadline - time.monotonic()))
        last.update(fresh)
        done |= {w for w, m in fresh.items() if obeyed(m, want)}
        if set(workers) <= done or time.monotonic() >= deadline:
            return last, [w for w in workers if w not in done]


def cmd_control(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.max_delay_ms is not None and args.batch_size is None:
        raise UsageError("--max-delay-ms goes with --batch-size")
    client = client_of(args)
    current = None
    if args.batch_size is not None and args.max_delay_ms is None:
        current = _current_delay(client, args.name, args.node)
    kind, body = control_body(args, current)
    request = {"type": kind, "body": body, "node": args.node}
    reply = client.call("POST", f"/apps/{args.name}/control", request)
    workers = list(reply["workers"])
    text = None if args.json else out
    if text:
        shown = f" {_show(body)}" if body else ""
        print(f"{kind}{shown} sent to {reply['sent']} of {len(workers)} worker(s) of "
              f"{args.node}: {', '.join(map(str, workers))}", file=text)  # fmt: skip
    if kind == "METRIC_REQ":
        answers = ask_metrics(client, args.name, args.node, workers, args.timeout)
        missing = [w for w in workers if w not in answers]
        return _metrics_result(args, out, answers, missing)
    if args.no_wait:
        return 0 if text else json_result(args, out, {**reply, "body": body}, 0)
    want = expected(kind, body)
    last, missing = confirm(client, args.name, args.node, workers, want, args.timeout)
    if not text:
        result = {
            **reply,
            "body": body,
            "confirmed": [w for w in workers if w not in missing],
            "not_confirmed": missing,
            "metrics": {str(w): m for w, m in last.items()},
        }
        return json_result(args, out, result, 1 if missing else 0)
    for w in workers:
        m = last.get(w)
        seen = ", ".join(f"{k} {_cell(m.get(k))}" for k in want) if m else "no answer"
        print(f"  [{'NOT CONFIRMED' if w in missing else 'ok'}] worker {w}: {seen}", file=text)
    if missing:
        raise VerbFailed(
            f"worker(s) {', '.join(map(str, missing))} did not confirm {kind} within "
            f"{args.timeout:g} s"
        )
    return 0


def _show(body: dict) -> str:
    return " ".join(f"{k}={_cell(v)}" for k, v in body.items())


METRIC_COLUMNS = (
    ("in", lambda m: sum(m.get("in", {}).values())),
    ("out", lambda m: sum(m.get("out", {}).values())),
    ("queue", lambda m: m.get("queue", 0)),
    ("proc_us", lambda m: round(m.get("proc_us", 0.0), 1)),
    ("rate", lambda m: m.get("rate")),
    ("batch", lambda m: m.get("batch_size")),
    ("delay_ms", lambda m: m.get("max_delay_ms")),
    ("active", lambda m: m.get("active")),
    ("done", lambda m: m.get("done")),
    ("drops", lambda m: sum(m.get("drops", {}).values())),
    ("rtt_ms", lambda m: m.get("rtt_ms")),
)


def _metrics_result(
    args: argparse.Namespace,
    out: TextIO,
    answers: dict[int, dict],
    missing: list[int],
) -> int:
    code = 1 if missing else 0
    if args.json:
        doc = {"metrics": {str(w): m for w, m in answers.items()}, "no_answer": missing}
        return json_result(args, out, doc, code)
    print("  worker  " + "  ".join(f"{name:>9}" for name, _ in METRIC_COLUMNS), file=out)
    for w, m in sorted(answers.items()):
        cells = "  ".join(f"{_cell(get(m)):>9}" for _, get in METRIC_COLUMNS)
        print(f"  {w:>6}  {cells}", file=out)
    if missing:
        raise VerbFailed(
            f"worker(s) {', '.join(map(str, missing))} did not answer METRIC_REQ within "
            f"{args.timeout:g} s"
        )
    return 0


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def add_control_parser(verb: Any) -> None:
    """Register ``typhoon control``.

    ``verb``: the helper of :func:`typhoon_cli.ctl.add_parsers`."""
    p = verb("control", cmd_control, "send a Table 2 control tuple to a node's workers")
    p.add_argument("name")
    p.add_argument("node")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--input-rate", type=float, metavar="N",
                      help="a spout's tuples per second (0: unlimited)")  # fmt: skip
    what.add_argument("--batch-size", type=int, metavar="N", help="tuples per batch")
    what.add_argument("--activate", action="store_true", help="start a spout's emission")
    what.add_argument("--deactivate", action="store_true", help="stop a spout's emission")
    what.add_argument("--metrics", action="store_true", help="ask each worker for its metrics")
    p.add_argument("--max-delay-ms", type=float, metavar="MS",
                   help="with --batch-size: longest a batch waits (default: kept)")  # fmt: skip
    p.add_argument("--no-wait", action="store_true", help="do not wait for the workers to confirm")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the workers")
