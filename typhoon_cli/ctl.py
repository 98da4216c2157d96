"""CLI verbs on the controller's REST API: submit, list, status, reconfigure, kill.

``typhoon submit|list|status|report|scale|route|swap|insert|remove|move|unchain|chain|
reconfig|kill``,
``control`` (Table 2: :mod:`typhoon_cli.ctl_control`), ``locality`` and the apps' reports
``faults|autoscaler|lb``: :func:`add_parsers` gives each one's arguments.
Where the controller is and the token: see :mod:`typhoon.client`; a running tcp job
serves the update verbs itself and is found by its name
(:func:`typhoon_cli.ctl_verb.client_of`, :mod:`typhoon.tcp_control`).

``--json`` on every verb prints one JSON document on stdout instead of text,
errors included (``{"ok": false, "error": ..., "exit": N}``).

A reconfiguration verb waits until the update has finished and prints each
step as it completes (``--no-wait`` returns once the controller accepted it).
Exit codes: 0 done; 1 the update failed (rolled back or incomplete) or the
controller could not be reached; 2 the controller refused the request (one
line on stderr says why).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import yaml

from typhoon.client import ApiCallError
from typhoon.report import summary_lines
from typhoon.topology import TopologyError, expand_environment
from typhoon_cli.ctl_control import add_control_parser
from typhoon_cli.ctl_faults import print_faults
from typhoon_cli.ctl_verb import EXIT_FAILED, UsageError, VerbFailed, client_of, json_result, run


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise UsageError(f'{what} must be a JSON object, e.g. \'{{"values": ["view"]}}\'')
    return value


def _request(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(verb, JSON body) of a reconfiguration verb."""
    if args.command == "scale":
        return "scale", {"node": args.node, "parallelism": args.parallelism}
    if args.command == "route":
        body: dict[str, Any] = {"stream": args.stream, "policy": args.policy}
        if args.fields:
            body["fields"] = [f for item in args.fields for f in item.split(",") if f]
        return "route", body
    if args.command == "swap":
        return "swap", {
            "node": args.node,
            "operator": args.operator,
            "args": _json_arg(args.args, "--args"),
        }
    if args.command == "insert":
        return "insert", {
            "node": args.node,
            "operator": args.operator,
            "from": args.src,
            "to": args.dst,
            "args": _json_arg(args.args, "--args"),
            "parallelism": args.parallelism,
            "grouping": args.grouping,
        }
    if args.command == "move":
        return "move", {"worker": args.worker, "host": args.host}
    if args.command in ("unchain", "chain"):
        one = {} if args.worker is None else {"worker": args.worker}
        return args.command, {"node": args.node, **one}
    return "remove", {"node": args.node}


UPDATED = ("done", "restarted")  # the update is in effect


def _print_steps(record: dict[str, Any], shown: int, out: TextIO) -> int:
    for step in record["steps"][shown:]:
        if step["state"] in ("pending", "running"):
            break
        mark = {"done": "ok", "failed": "FAILED"}.get(step["state"], step["state"])
        detail = f" ({step['detail']})" if step["detail"] else ""
        print(f"  [{mark}] {step['what']}  {step['seconds'] * 1000:.0f} ms{detail}", file=out)
        shown += 1
    return shown


def _outcome(record: dict[str, Any], out: TextIO, err: TextIO) -> int:
    for step in record.get("rollback", []):
        print(f"  [undo {step['state']}] {step['what']} {step['detail']}".rstrip(), file=out)
    if record["state"] in UPDATED:
        # restarted (tcp, under a guarantee): a worker died during it; all run the update now
        note = f" ({record['error']})" if record["error"] else ""
        print(f"reconfiguration {record['id']} {record['state']} in {record['seconds']:.2f} s"
              f"{note}", file=out)  # fmt: skip
        return 0
    print(f"error: reconfiguration {record['id']} {record['state']}: {record['error']}", file=err)
    return EXIT_FAILED


def cmd_reconfigure(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    kind, body = _request(args)
    client = client_of(args)
    record = client.call("POST", f"/apps/{args.name}/{kind}", body)
    text = None if args.json else out
    if text:
        print(f"reconfiguration {record['id']} of {args.name}: {record['request']}", file=text)
    if args.no_wait:
        return json_result(args, out, record, 0)
    shown = 0
    deadline = time.monotonic() + args.timeout
    while record["state"] == "running":
        if text:
            shown = _print_steps(record, shown, text)
        if time.monotonic() > deadline:
            raise VerbFailed(f"still running after {args.timeout:g} s")
        time.sleep(0.1)
        record = client.call("GET", f"/apps/{args.name}/reconfig")
    if not text:
        return json_result(args, out, record, 0 if record["state"] in UPDATED else EXIT_FAILED)
    _print_steps(record, shown, text)
    return _outcome(record, out, err)


def cmd_reconfig(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    record = client_of(args).call("GET", f"/apps/{args.name}/reconfig")
    code = 0 if record["state"] in ("running", "done") else EXIT_FAILED
    if args.json:
        return json_result(args, out, record, code)
    print(f"reconfiguration {record['id']} of {args.name}: {record['request']}", file=out)
    _print_steps(record, 0, out)
    return 0 if record["state"] == "running" else _outcome(record, out, err)


def cmd_submit(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {args.file}: {e}") from None
    try:  # ${NAME} is the submitter's environment: the controller substitutes nothing
        text = expand_environment(text, args.file)
    except TopologyError as e:
        raise UsageError(str(e)) from None
    body = {"topology": text, **({"remove_when_done": True} if args.remove_when_done else {})}
    reply = client_of(args).call("POST", "/apps", body)
    if args.json:
        return json_result(args, out, reply, 0)
    print(f"submitted {reply['name']}: {len(reply['workers'])} workers", file=out)
    for w in reply["workers"]:
        print(f"  worker {w['worker_id']}: {w['node']}[{w['index']}] on {w['host']} port "
              f"{w['port']}", file=out)  # fmt: skip
    return 0


def cmd_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    apps = client_of(args).call("GET", "/apps")
    if args.json:
        return json_result(args, out, apps, 0)
    if not apps:
        print("no applications (typhoon submit FILE starts one; typhoon report NAME reads "
              "the report of one that finished)", file=out)  # fmt: skip
    for name, a in sorted(apps.items()):
        print(f"{name}  app {a['app_id']:#06x}  version {a['version']}  {_state(a)}", file=out)
    return 0


def _state(state: dict[str, Any]) -> str:
    if state.get("finished"):
        return f"finished ({'ok' if state.get('ok') else 'not ok'}: typhoon report)"
    return "active" if state.get("active") else "starting"


def cmd_run_report(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The merged run report of a submitted job (``--wait``: once it has finished)."""
    client = client_of(args)
    deadline = time.monotonic() + args.timeout
    report = client.call("GET", f"/apps/{args.name}/report")
    while args.wait and not report.get("finished"):
        if time.monotonic() > deadline:
            raise VerbFailed(f"{args.name} has not finished after {args.timeout:g} s")
        time.sleep(0.5)
        report = client.call("GET", f"/apps/{args.name}/report")
    code = 0 if report["ok"] else EXIT_FAILED
    if args.json:
        return json_result(args, out, report, code)
    verdict = "ok" if report["ok"] else "NOT OK"
    print(f"{args.name}: {'finished' if report.get('finished') else 'running'}, {verdict}",
          file=out)  # fmt: skip
    for w in report.get("worker_states", []):
        code_text = "" if w["exit_code"] is None else f" (exit code {w['exit_code']})"
        error = f": {w['error']}" if w["error"] else ""
        print(f"  worker {w['worker']:>3}  {w['node']}[{w['index']}] on {w['host']}  "
              f"{w['state']}{code_text}{error}", file=out)  # fmt: skip
    for line in summary_lines(report):
        print(line, file=out)
    return code


def cmd_status(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client = client_of(args)
    if args.watch is None:
        return _show_status(args, client.call("GET", f"/apps/{args.name}"), out)
    if args.watch < 0.1:
        raise UsageError("--watch takes a period of at least 0.1 s")
    return watch(
        lambda: client.call("GET", f"/apps/{args.name}"),
        lambda s, o: _show_status(args, s, o),
        args.watch,
        out,
        args.count,
    )


def watch(
    fetch: Callable[[], Any],
    show: Callable[[Any, TextIO], int],
    period: float,
    out: TextIO,
    count: int | None = None,
) -> int:
    """Show ``fetch()`` every ``period`` seconds (``count`` times, or until interrupted):
    redrawn in place on a terminal (rich), one block after another otherwise."""
    import io

    live = None
    if out.isatty():
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        live = Live(console=Console(file=out), auto_refresh=False)
        live.start()
    shown = 0
    try:
        while count is None or shown < count:
            if shown:
                time.sleep(period)
            doc = fetch()
            if live is None:
                show(doc, out)
            else:
                buf = io.StringIO()
                show(doc, buf)
                live.update(Text(buf.getvalue()), refresh=True)
            shown += 1
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    return 0


def _show_status(args: argparse.Namespace, s: dict[str, Any], out: TextIO) -> int:
    if args.json:
        return json_result(args, out, s, 0)
    print(f"{s['name']}  app {s['app_id']:#06x}  physical version {s['version']}  "
          f"{_state(s.get('state') or {})}", file=out)  # fmt: skip
    for name, n in s["nodes"].items():
        print(f"  node {name}: {n['operator']} {json.dumps(n['args'])} x{n['parallelism']}",
              file=out)  # fmt: skip
    for st in s["streams"]:
        keys = f" on {','.join(st['fields'])}" if st["fields"] else ""
        print(f"  stream {st['id']}: {st['from']} -> {st['to']} [{st['policy']}{keys}]", file=out)
    event_time = any("watermark" in w or "watermark_closed" in w for w in s["workers"])
    print("  worker  node          host  port  state     role      in/s       out/s"
          + ("  watermark" if event_time else ""), file=out)  # fmt: skip
    for w in s["workers"]:
        r = w.get("rate") or {}
        print(
            f"  {w['worker']:>6}  {w['node'][:12]:<12}  {w['host']:<4}  {w['port']:>4}  "
            f"{w['state']:<8}  {w['role']:<8}  {r.get('in', 0):>9,.0f}  {r.get('out', 0):>10,.0f}"
            + (f"  {_watermark(w)}" if event_time else ""),
            file=out,
        )
    rc = s.get("reconfig")
    if rc:
        print(f"  last reconfiguration {rc['id']}: {rc['request']} -> {rc['state']}", file=out)
    return 0


def _watermark(w: dict[str, Any]) -> str:
    """A worker's event-time watermark for ``status``: +inf once every input finished."""
    if w.get("watermark_closed"):
        return "+inf"
    wm = w.get("watermark")
    return "-" if wm is None else str(wm)


def cmd_kill(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client_of(args).call("DELETE", f"/apps/{args.name}")
    if args.json:
        return json_result(args, out, {"killed": args.name}, 0)
    print(f"killed {args.name}", file=out)
    return 0


def cmd_report(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """An app's report (``faults``, ``autoscaler``, ``lb``), of one application or all."""
    what = args.command
    path = f"/apps/{args.name}/{what}" if args.name else f"/{what}"
    try:
        doc = client_of(args).call("GET", path)
    except ApiCallError as e:
        if e.status == 404 and not args.name:
            app = {"faults": "fault_detector", "autoscaler": "autoscaler", "lb": "load_balancer"}
            raise ApiCallError(
                404, f"the controller has no {what} report: is apps/{app[what]}.py loaded?"
            ) from None
        raise
    if args.json:
        return json_result(args, out, doc, 0)
    if what == "faults":
        print_faults(doc, out)
    else:
        out.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False) or "{}\n")
    return 0


def cmd_locality(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run the locality router on NAME and wait (``apps/locality_router.py``), or show it."""
    client = client_of(args)
    path = f"/apps/{args.name}/locality"
    try:
        doc = client.call("GET" if args.show else "POST", path)
    except ApiCallError as e:
        if e.status == 404 and not any(s in e.message for s in ("no locality", "no appl")):
            raise ApiCallError(404, f"{e.message} (is apps/locality_router.py loaded?)") from None
        raise
    deadline = time.monotonic() + args.timeout
    while not args.show and not args.no_wait and doc["phase"] in LOCALITY_RUNNING:
        if time.monotonic() > deadline:
            raise VerbFailed(f"still in phase {doc['phase']} after {args.timeout:g} s")
        time.sleep(0.2)
        doc = client.call("GET", path)
    code = EXIT_FAILED if doc["phase"] == "failed" else 0
    if args.json:
        return json_result(args, out, doc, code)
    out.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    if code:
        print(f"error: locality run failed: {doc['reason']}", file=err)
    return code


LOCALITY_RUNNING = ("collecting", "routing", "measuring")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register the verbs on the ``typhoon`` command's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--controller", help="REST URL (default: $TYPHOON_CONTROLLER, config)")
    common.add_argument("--token", help="API token (default: $TYPHOON_TOKEN, config)")
    common.add_argument("--config", help="INI file with [typhoon] controller/token")
    common.add_argument(
        "--json", action="store_true", help="one JSON document on stdout, errors included"
    )

    def verb(name: str, func, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_)
        p.set_defaults(func=run, ctl_func=func)
        return p

    def waits(p: argparse.ArgumentParser) -> None:
        p.add_argument("--no-wait", action="store_true", help="return once accepted")
        p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait")

    p = verb("submit", cmd_submit, "submit a topology file to the controller")
    p.add_argument("file")
    p.add_argument("--remove-when-done", action="store_true",
                   help="remove the job once it has finished and its report is stored")  # fmt: skip
    verb("list", cmd_list, "list running applications")
    p = verb("report", cmd_run_report, "the merged run report of a submitted job")
    p.add_argument("name")
    p.add_argument("--wait", action="store_true", help="until the job has finished")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits")
    p = verb("status", cmd_status, "workers, hosts, ports and rates of an application")
    p.add_argument("name")
    p.add_argument("--watch", type=float, metavar="S", help="show it again every S seconds")
    p.add_argument("--count", type=int, help="with --watch: stop after this many")
    p = verb("scale", cmd_reconfigure, "change a node's parallelism at run time")
    p.add_argument("name")
    p.add_argument("node")
    p.add_argument("parallelism", type=int)
    waits(p)
    p = verb("route", cmd_reconfigure, "change a stream's routing policy or key fields")
    p.add_argument("name")
    p.add_argument("stream", help="stream ID, or SRC:DST")
    p.add_argument("policy", help="shuffle, fields, global, all, local_or_shuffle, direct, sdn")
    p.add_argument("--fields", nargs="+", metavar="FIELD", help="key fields (fields policy)")
    waits(p)
    p = verb("swap", cmd_reconfigure, "replace a node's logic (operator and/or arguments)")
    p.add_argument("name")
    p.add_argument("node")
    p.add_argument("operator")
    p.add_argument("--args", help='operator arguments as JSON, e.g. \'{"values": ["view"]}\'')
    waits(p)
    p = verb("insert", cmd_reconfigure, "insert a node on the stream between two nodes")
    p.add_argument("name")
    p.add_argument("node")
    p.add_argument("operator")
    p.add_argument("--from", dest="src", required=True)
    p.add_argument("--to", dest="dst", required=True)
    p.add_argument("--args")
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--grouping", default="shuffle")
    waits(p)
    p = verb("remove", cmd_reconfigure, "take a node out; its input goes to its output")
    p.add_argument("name")
    p.add_argument("node")
    waits(p)
    p = verb("move", cmd_reconfigure, "move a running worker, with its state, to another host")
    p.add_argument("name")
    p.add_argument("worker", type=int, help="worker ID (typhoon status NAME lists them)")
    p.add_argument("host")
    waits(p)
    for kind, help_ in (
        ("unchain", "run a node's chained edges on the network; its process stays"),
        ("chain", "run a node's live-unchained edges as function calls again"),
    ):
        p = verb(kind, cmd_reconfigure, help_)
        p.add_argument("name")
        p.add_argument("node")
        p.add_argument("--worker", type=int, help="only this worker's chain instance")
        waits(p)
    verb("reconfig", cmd_reconfig, "the running or last reconfiguration").add_argument("name")
    verb("kill", cmd_kill, "stop an application and remove it").add_argument("name")
    p = verb(
        "locality", cmd_locality, "route correlated keys to one host (apps/locality_router.py)"
    )
    p.add_argument("name")
    p.add_argument("--show", action="store_true", help="show the last run, start none")
    waits(p)
    add_control_parser(verb)
    for name, help_ in (
        ("faults", "the fault detector's incidents (apps/fault_detector.py)"),
        ("autoscaler", "the autoscaler's decisions (apps/autoscaler.py)"),
        ("lb", "configured and achieved load-balancer splits (apps/load_balancer.py)"),
    ):
        verb(name, cmd_report, help_).add_argument("name", nargs="?", help="one application")
