"""``typhoon debug attach|detach|list|tuples``: the live debugger from a terminal.

``attach`` asks the controller for a debug session, waits until the mirrors
are live, then prints the observed tuples as they pass (polling the session's
ring buffer over REST) until Ctrl-C, which detaches: the debug worker stops
and every mirror output is removed.  Tuples go to stdout, everything else to
stderr, so ``--format json`` output can be piped.

The controller's REST address and token are found like for every REST verb
(``typhoon.client``): ``--controller`` / ``--token``, ``$TYPHOON_CONTROLLER`` /
``$TYPHOON_TOKEN``, or a ``--config`` file.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from typhoon.client import ApiCallError, Client, resolve

LIVE_TIMEOUT = 30.0
STATUS_S = 5.0  # how often a follow re-reads the session's counters to report sampling
EVERY_FRAME = "all"  # --rate all: no meter, the switch copies every frame
EXIT_FAILED = 1
EXIT_USAGE = 2


def client(args: argparse.Namespace) -> Client:
    return Client(resolve(args.controller, args.token, args.config), timeout=10.0)


def _exit_code(e: ApiCallError) -> int:
    return EXIT_USAGE if e.bad_request else EXIT_FAILED


NOT_LOADED = (
    "the controller has no live debugger: the live_debugger app is not loaded (add it to "
    "apps = in the [controller] section of controller.conf, or --app live_debugger, and "
    "restart the controller)"
)


def _explain(e: ApiCallError) -> str:
    """The error to print; a 404 that is not ours (no JSON error of the debugger's routes)
    means the app that serves them is not loaded."""
    return NOT_LOADED if e.status == 404 and e.message == "Not Found" else str(e)


def format_record(record: dict[str, Any], fmt: str) -> str:
    """One line per tuple: JSON, or a table row (time, sender -> receiver, stream, fields)."""
    if fmt == "json":
        return json.dumps(record, ensure_ascii=False, sort_keys=True)
    stamp = datetime.fromtimestamp(record.get("time", 0)).strftime("%H:%M:%S.%f")[:-3]
    if "raw" in record:
        return f"{stamp}  {'raw frame':<24}  {record['raw']}"
    link = f"{record.get('src_label', '?')} -> {record.get('dst_label', '?')}"
    fields = record.get("fields") or {}
    extra = record.get("values", [])[len(fields) :]
    shown = [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in fields.items()]
    shown += [json.dumps(v, ensure_ascii=False) for v in extra]
    return f"{stamp}  {link:<24}  s{record.get('stream', '?'):<3} {' '.join(shown)}"


def _summary(stats: dict[str, Any]) -> str:
    keys = (
        "frames", "tuples", "matched", "sampled_out", "shipped", "seq_gaps", "switch_copied",
        "switch_sampled", "switch_dropped", "ring_dropped", "undecodable", "op_tuples",
        "op_emitted", "op_errors",
    )  # fmt: skip
    text = ", ".join(f"{k} {stats[k]}" for k in keys if k in stats) or "no statistics"
    if stats.get("op_error"):
        text += f"; the operator's last error: {stats['op_error']}"
    return text


def sampling_note(rate: Any, sample: float | None = None) -> str:
    """What the user sees of a session: every frame, or the switch's sampling (and the
    debug worker's percentage), so a sampled view is never taken for every tuple."""
    if rate == EVERY_FRAME:
        text = "the switch copies every frame (no meter)"
    elif rate is None:
        text = "the controller did not say whether the switch samples (no 'rate')"
    else:
        text = (
            f"SAMPLED: the switch copies at most {rate} frames/s to the debugger and never "
            f"copies the rest (--rate {EVERY_FRAME} copies every frame)"
        )
    if sample is not None and sample < 100:
        text += f"; {sample:g} % of the matching tuples are shown"
    return text


def switch_counts(stats: dict[str, Any], rate: Any) -> str:
    """The switch's side of a session: copies made, left out by the meter, dropped at the
    debug port (empty before the first counters came)."""
    if "switch_copied" not in stats and "switch_dropped" not in stats:
        return ""
    parts = [f"switch copied {stats.get('switch_copied', 0)} frames"]
    if rate == EVERY_FRAME:
        parts.append("none left out (no meter)")
    else:
        parts.append(f"left out {stats.get('switch_sampled', 0)} by sampling (meter {rate}/s)")
    parts.append(f"dropped {stats.get('switch_dropped', 0)} the debug port could not take")
    return ", ".join(parts)


@dataclass
class SamplingWatch:
    """Says, while following, when the switch left frames out or dropped copies since the
    last note (re-read every ``STATUS_S``)."""

    rate: Any
    sampled: int = 0
    dropped: int = 0

    def note(self, stats: dict[str, Any]) -> str:
        sampled = int(stats.get("switch_sampled") or 0)
        dropped = int(stats.get("switch_dropped") or 0)
        if sampled <= self.sampled and dropped <= self.dropped:
            return ""
        self.sampled, self.dropped = max(sampled, self.sampled), max(dropped, self.dropped)
        copied = stats.get("switch_copied", 0)
        parts = []
        if sampled:
            parts.append(f"the switch's meter ({self.rate}/s) left out {sampled} frames")
        if dropped:
            parts.append(f"the debug port dropped {dropped} copies")
        return f"(so far: {'; '.join(parts)}; {copied} copied)"


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def cmd_attach(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout  # looked up now: tests and callers redirect them
    err = err or sys.stderr
    body: dict[str, Any] = {"worker": args.worker, "direction": args.direction}
    if args.filter:
        body["filter"] = args.filter
    if args.sample is not None:
        body["sample"] = args.sample
    if args.last is not None:
        body["last"] = args.last
    if args.rate is not None:
        body["rate"] = args.rate
    if args.operator:
        body["operator"] = args.operator
    try:
        api = client(args)
        session = api.call("POST", f"/apps/{args.name}/debug", body)
    except ApiCallError as e:
        print(f"error: {_explain(e)}", file=err)
        return _exit_code(e)
    sid = session["session"]
    path = f"/apps/{args.name}/debug/{sid}"
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # kill: detach like Ctrl-C
    outcome, code = "interrupted", 0
    try:
        outcome, code = _follow(api, args, path, out, err)
    except KeyboardInterrupt:
        pass
    except ApiCallError as e:
        print(f"error: {_explain(e)}", file=err)
        outcome, code = "error", EXIT_FAILED
    finally:
        signal.signal(signal.SIGTERM, previous)
        try:  # also after an error or an ending: never leave mirrors behind
            final = api.call("DELETE", path)
            print(f"detached session {sid} ({outcome}): {_summary(final['stats'])}", file=err)
            counts = switch_counts(final["stats"], final.get("rate"))
            if counts:
                print(f"session {sid}: {counts}", file=err)
        except ApiCallError as e:
            if e.status != 404:
                print(f"error: detach of session {sid} failed: {e}", file=err)
    return code


def _follow(
    api: Client, args: argparse.Namespace, path: str, out: TextIO, err: TextIO
) -> tuple[str, int]:
    """Wait until the session is live, then print its tuples; (outcome, exit code)."""
    session = _wait_live(api, path)
    if session["state"] != "live":
        print(f"error: session {session['session']} did not go live: {session['reason']}", file=err)
        return "failed", EXIT_FAILED
    print(
        f"session {session['session']}: watching {args.name} worker {session['worker']} "
        f"({session['direction']}) through {session['mirrored_rules']} mirrored rules on "
        f"{session['host']}"
        + (f", through operator {session['operator']}" if session.get("operator") else "")
        + "; Ctrl-C detaches",
        file=err,
        flush=True,
    )
    note = sampling_note(session.get("rate"), session.get("sample"))
    print(
        f"session {session['session']}: {note}",
        file=err,
        flush=True,
    )
    watch = SamplingWatch(session.get("rate"))
    status_at = time.monotonic() + STATUS_S
    printed, after = 0, 0
    while args.count is None or printed < args.count:
        if time.monotonic() >= status_at:
            status_at = time.monotonic() + STATUS_S
            note = watch.note(api.call("GET", path)["stats"])
            if note:
                print(note, file=err, flush=True)
        page = api.call("GET", f"{path}/tuples?after={after}&limit=1000")
        if page["skipped"]:
            print(f"({page['skipped']} tuples left the ring before they were read)", file=err)
        for record in page["records"][: None if args.count is None else args.count - printed]:
            print(format_record(record, args.format), file=out, flush=True)
            printed += 1
        after = page["next"]
        if page["state"] == "ended":
            print(f"session ended: {page['reason']}", file=err)
            return "ended", EXIT_FAILED
        if not page["records"]:
            time.sleep(args.poll)
    return f"{printed} tuples printed", 0


def _wait_live(api: Client, path: str) -> dict[str, Any]:
    deadline = time.monotonic() + LIVE_TIMEOUT
    while True:
        session = api.call("GET", path)
        if session["state"] in ("live", "ended") or time.monotonic() > deadline:
            return session
        time.sleep(0.1)


def cmd_detach(args: argparse.Namespace, err: TextIO | None = None) -> int:
    err = err or sys.stderr
    try:
        final = client(args).call("DELETE", f"/apps/{args.name}/debug/{args.session}")
    except ApiCallError as e:
        print(f"error: {_explain(e)}", file=err)
        return _exit_code(e)
    print(f"detached session {args.session}: {_summary(final['stats'])}", file=err)
    counts = switch_counts(final["stats"], final.get("rate"))
    if counts:
        print(f"session {args.session}: {counts}", file=err)
    return 0


def cmd_list(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up now: tests and callers redirect them
    err = err or sys.stderr
    try:
        sessions = client(args).call("GET", f"/apps/{args.name}/debug")
    except ApiCallError as e:
        print(f"error: {_explain(e)}", file=err)
        return _exit_code(e)
    for s in sessions:
        rate = s.get("rate")
        copies = "every frame" if rate == EVERY_FRAME else f"sampled {rate}/s"
        print(
            f"{s['session']}  worker {s['worker']} {s['direction']:<4} {s['state']:<9} "
            f"{s['host']}:{s['port']}  {copies}  received {s['received']}  "
            f"filter {s['filter']!r}" + (f"  ({s['reason']})" if s["reason"] else ""),
            file=out,
        )
    return 0


def cmd_tuples(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Print the ring buffer of a session (the last ``--last`` records it holds)."""
    out = out or sys.stdout  # looked up now: tests and callers redirect them
    err = err or sys.stderr
    api = client(args)
    path = f"/apps/{args.name}/debug/{args.session}/tuples"
    try:
        received = api.call("GET", f"{path}?after=0&limit=0")["received"]
        after = max(0, received - args.last) if args.last else 0
        page = api.call("GET", f"{path}?after={after}&limit=10000")
    except ApiCallError as e:
        print(f"error: {_explain(e)}", file=err)
        return _exit_code(e)
    for record in page["records"]:
        print(format_record(record, args.format), file=out)
    return 0


def _controller_options(p: argparse.ArgumentParser) -> None:
    """The same options as the other REST verbs (typhoon_cli.ctl)."""
    p.add_argument("--controller", help="REST URL (default: $TYPHOON_CONTROLLER, config)")
    p.add_argument("--token", help="API token (default: $TYPHOON_TOKEN, config)")
    p.add_argument("--config", help="INI file with [typhoon] controller/token")


def _rate(text: str) -> int | str:
    """``--rate``: frames per second (the switch's meter), or ``all`` for every frame."""
    if text.strip().lower() == EVERY_FRAME:
        return EVERY_FRAME
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number of frames per second or '{EVERY_FRAME}'"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1 frame per second (or 'all')")
    return value


def _percent(text: str) -> float:
    value = float(text)
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError("must be a percentage in (0, 100]")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``debug`` and its verbs to the ``typhoon`` command line."""
    d = sub.add_parser("debug", help="live debugger: watch a worker's tuples as they pass")
    verbs = d.add_subparsers(dest="debug_command", required=True)

    a = verbs.add_parser("attach", help="print a worker's input or output until Ctrl-C")
    a.add_argument("name", help="application name")
    a.add_argument("worker", help="worker id or NODE[INDEX], e.g. split[0]")
    a.add_argument("--direction", choices=["in", "out", "both"], default="out")
    a.add_argument("--filter", default="", metavar="EXPR", help='e.g. "word in a,b or n>3"')
    a.add_argument("--sample", type=_percent, default=None, metavar="P", help="percent shown")
    a.add_argument(
        "--rate", type=_rate, default=None, metavar="F|all",
        help="frames/s the switch copies to the debugger, the rest are never copied (the "
        "controller's default: 200, sampling); 'all': every frame, no meter (paper Fig. 12)",
    )  # fmt: skip
    a.add_argument(
        "--operator", default="", metavar="MODULE:CLASS",
        help="a bolt the debug worker runs over the tuples shown; its output is shown instead",
    )  # fmt: skip
    a.add_argument("--format", choices=["json", "table"], default="table")
    a.add_argument("--last", type=int, default=None, metavar="N", help="ring buffer size")
    a.add_argument("--count", type=int, default=None, help="detach after this many tuples")
    a.add_argument("--poll", type=float, default=0.2, help="seconds between reads when idle")
    _controller_options(a)
    a.set_defaults(func=cmd_attach)

    t = verbs.add_parser("detach", help="end a session: debug worker and mirrors go")
    t.add_argument("name")
    t.add_argument("session")
    _controller_options(t)
    t.set_defaults(func=cmd_detach)

    ls = verbs.add_parser("list", help="sessions of an application")
    ls.add_argument("name")
    _controller_options(ls)
    ls.set_defaults(func=cmd_list)

    tu = verbs.add_parser("tuples", help="print a session's ring buffer")
    tu.add_argument("name")
    tu.add_argument("session")
    tu.add_argument("--last", type=int, default=None, metavar="N")
    tu.add_argument("--format", choices=["json", "table"], default="table")
    _controller_options(tu)
    tu.set_defaults(func=cmd_tuples)
