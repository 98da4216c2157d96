"""``typhoon`` command line: validate and run topology files; drive a running controller.

``typhoon submit|list|status|scale|route|swap|insert|remove|reconfig|kill``
talk to the controller's REST API (see ``typhoon_cli.ctl`` for the verbs and
``typhoon.client`` for where the controller URL and token come from), or to a
running tcp job's own control endpoint (``typhoon.tcp_control``) found by its name.

Exit codes: 0 success, 1 the run failed (a worker crashed, tuples were
lost where none may be), 2 bad input (topology file, arguments).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from typhoon import __version__, logs
from typhoon.cluster import FIRST_WORKER_PORT
from typhoon.cluster_file import ClusterFileError
from typhoon.coordinator import CoordinatorError
from typhoon.manager import ManagerError
from typhoon.operators import ConnectorError, OperatorError, preflight, resolve_operator
from typhoon.report import summary_lines
from typhoon.topology import TopologyError, batching, load_topology, schedule
from typhoon.topology.model import Topology
from typhoon.topology.scheduler import app_id_for
from typhoon_cli import bench as bench_cli
from typhoon_cli import cluster as cluster_cli
from typhoon_cli import ctl
from typhoon_cli import debug as debug_cli

# The top layer: the one package that composes the core with the runners (mininet_env)
# and the benchmarks; no package imports it (tests/unit/test_layering.py).

EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line input; the message is one plain sentence."""


def apply_run_settings(
    topology: Topology, batch_size: int | None, max_delay_ms: float | None
) -> None:
    """One rule on both transports: the command line over the file's ``config:`` over the
    default (the runners fill in the default only where the file is silent)."""
    if batch_size is not None and batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    if max_delay_ms is not None and max_delay_ms < 0:
        raise UsageError("--max-delay-ms must not be negative")
    batching.override(topology.config, batch_size, max_delay_ms)


def apply_overrides(topology: Topology, overrides: list[str]) -> None:
    """``node.arg=value`` pairs (value parsed as YAML) change operator arguments."""
    for item in overrides:
        target, sep, raw = item.partition("=")
        node, dot, arg = target.partition(".")
        if not sep or not dot or not arg:
            raise UsageError(f"--arg '{item}' is not of the form node.arg=value")
        if node not in topology.nodes:
            raise UsageError(f"--arg '{item}': no node named '{node}'")
        topology.nodes[node].args[arg] = yaml.safe_load(raw)
    for node in topology.nodes.values():
        try:
            resolve_operator(node.operator)(**node.args)
        except (TypeError, ValueError, OperatorError) as e:
            raise UsageError(f"node '{node.name}': bad operator arguments ({e})") from e


def hosts_list(n: int) -> list[str]:
    if n < 1:
        raise UsageError("--hosts must be at least 1")
    return [f"h{i}" for i in range(1, n + 1)]


def cmd_validate(args: argparse.Namespace) -> int:
    topo = load_topology(args.file)
    # the ports the manager gives on an empty cluster: it starts at the hosts'
    # first_worker_port (below it: fabric links and tunnels) and skips ports in use
    physical = schedule(
        topo, hosts_list(args.hosts), app_id_for(topo.name), first_port=FIRST_WORKER_PORT
    )
    print(f"{args.file}: topology '{topo.name}' is valid")
    for node in topo.nodes.values():
        print(
            f"  {node.kind:5} {node.name}: {node.operator} x{node.parallelism}"
            f" ({node.engine}{', stateful' if node.stateful else ''})"
            f" fields={list(node.output_fields)}"
            + (f" watermark={node.watermark}" if node.watermark else "")
        )
    for s in topo.streams:
        extra = f" on {list(s.grouping.fields)}" if s.grouping.fields else ""
        print(f"  stream {s.id}: {s.src} -> {s.dst} [{s.grouping.type}{extra}]")
    for w in physical.workers:
        print(f"  worker {w.worker_id}: {w.node}[{w.index}] on {w.host} port {w.port}")
    print(f"  (ports as the manager gives them on a cluster with none in use: from "
          f"{FIRST_WORKER_PORT}, the hosts' first_worker_port)")  # fmt: skip
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    topo = load_topology(args.file)
    apply_overrides(topo, args.arg or [])
    apply_run_settings(topo, args.batch_size, args.max_delay_ms)
    try:  # an outside server (connectors) that cannot be used: one sentence, exit 2
        preflight(
            [(n.name, n.operator, n.args) for n in topo.nodes.values() if n.engine == "python"]
        )
    except ConnectorError as e:
        raise UsageError(str(e)) from None
    report: dict[str, Any]
    if args.scale and args.transport != "tcp":
        raise UsageError("--scale is for tcp runs; on sdn, `typhoon scale` a submitted job")
    if (args.unchain or args.chain) and args.transport != "tcp":
        raise UsageError(
            "--unchain and --chain are for tcp runs; on sdn, `typhoon unchain` or "
            "`typhoon chain` a submitted job"
        )
    if args.locality is not None and args.transport != "tcp":
        raise UsageError(
            "--locality is for tcp runs; on sdn, load apps/locality_router.py and "
            "`typhoon locality` a submitted job"
        )
    if args.control is not None and args.transport != "tcp":
        raise UsageError("--control is for tcp runs; an sdn run's verbs go to its controller")
    if args.transport == "tcp":
        from typhoon.tcp_cluster import RunOptions, run_tcp

        locality = locality_run(topo, args.locality)
        options = RunOptions(
            hosts=hosts_list(args.hosts),
            duration=args.duration,
            live=not args.quiet,
            workdir=Path(args.workdir) if args.workdir else None,
            scales=tcp_scales(topo, args.scale or [])
            + tcp_chain_verbs(topo, args.unchain or [], args.chain or []),
            on_turn=[locality] if locality is not None else [],
            endpoint=control_endpoint(args.control),
        )
        report = run_tcp(topo, options)
        if locality is not None:
            report["locality"] = moved = locality.report()
            if moved["phase"] == "failed":  # asked for and not done: the run is not ok
                report["problems"].append(f"locality move: {moved['reason']}")
                report["ok"] = False
    else:
        # the CLI is the top layer: the only core module that reaches into mininet_env
        from mininet_env.fabric import FabricPlan
        from mininet_env.run import SdnRunOptions, run_sdn

        try:
            extra = {} if args.socket_buffer is None else {"socket_buffer": args.socket_buffer}
            plan = FabricPlan(
                hosts=args.hosts,
                shape=args.fabric,
                bw_mbit=args.bw,
                delay=args.delay,
                mtu=args.mtu,
                **extra,
            )
        except ValueError as e:
            raise UsageError(str(e)) from e
        options = SdnRunOptions(
            plan=plan,
            apps=args.app or [],
            duration=args.duration,
            live=not args.quiet,
            workdir=Path(args.workdir) if args.workdir else None,
        )
        report = run_sdn(topo, options)
    text = json.dumps(report, indent=2)
    # with --report - the report is stdout and the summary goes to stderr
    out = sys.stderr if args.report == "-" else sys.stdout
    if args.report == "-":
        print(text, flush=True)
    elif args.report:
        Path(args.report).write_text(text)
    print(json.dumps({"ok": report["ok"], "elapsed_s": report["elapsed_s"]}), file=out)
    print_summary(report, out)
    return 0 if report["ok"] else EXIT_FAILED


def tcp_scales(topology: Topology, items: list[str]) -> list[tuple[float, Any]]:
    """``--scale AT:NODE=N`` options, each checked against what tcp can rescale."""
    from typhoon.reconfig import ReconfigError, apply_request
    from typhoon.tcp_requests import parse_scale_option, tcp_refusal

    parsed = []
    for item in items:
        try:
            parsed.append((*parse_scale_option(item), item))
        except ValueError as e:
            raise UsageError(str(e)) from None
    out = []
    for at, scale, item in sorted(parsed, key=lambda p: p[0]):  # in the order they happen
        try:
            refusal = tcp_refusal(topology, scale)
            if refusal is not None:
                raise ReconfigError(refusal)
            topology = apply_request(topology, scale)[0]  # a spout, the same parallelism
        except (ValueError, ReconfigError) as e:
            raise UsageError(f"--scale '{item}': {e}") from None
        out.append((at, scale))
    return out


def tcp_chain_verbs(
    topology: Topology, unchain: list[str], chain: list[str]
) -> list[tuple[float, Any]]:
    """``--unchain`` / ``--chain AT:NODE[:WORKER]`` options, each naming a chained node."""
    from typhoon.tcp_requests import parse_chain_option
    from typhoon.topology.chaining import chained_nodes

    out = []
    for verb, items in (("unchain", unchain), ("chain", chain)):
        for item in items:
            try:
                at, request = parse_chain_option(item, verb)
            except ValueError as e:
                raise UsageError(str(e)) from None
            if request.node not in chained_nodes(topology):
                raise UsageError(
                    f"--{verb} '{item}': '{request.node}' is not a node of a chain of "
                    f"'{topology.name}' (docs/topology.md, \"Chaining\")"
                )
            out.append((at, request))
    return out


def control_endpoint(text: str | None) -> str | None:
    """``--control HOST:PORT|off`` of a tcp run: where its control endpoint listens
    (typhoon.tcp_control; default 127.0.0.1, any free port), None: off."""
    if text == "off":
        return None
    from typhoon.tcp_control import parse_endpoint

    address = text or "127.0.0.1:0"
    try:
        parse_endpoint(address)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return address


def locality_run(topology: Topology, at: str | None) -> Any:
    """``--locality AT``: the locality router's run AT seconds into a tcp run, or None."""
    if at is None:
        return None
    from typhoon_cli.tcp_locality import TcpLocality, check_locality, parse_locality_option

    try:
        seconds = parse_locality_option(at)
    except ValueError as e:
        raise UsageError(str(e)) from None
    refusal = check_locality(topology)
    if refusal is not None:
        raise UsageError(f"--locality {at}: {refusal}")
    return TcpLocality(seconds)


def print_summary(report: dict[str, Any], out: Any) -> None:
    """Problems, the failed workers' tracebacks, and one line per node's result."""
    for line in summary_lines(report):
        print(line, file=out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="typhoon", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"typhoon {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug output")
    p.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        help=f"text (default) or json lines, also for the processes a run starts (${logs.ENV})",
    )
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="check a topology file and print the plan")
    v.add_argument("file")
    v.add_argument("--hosts", type=int, default=1, help="hosts to schedule on (default 1)")
    v.set_defaults(func=cmd_validate)

    r = sub.add_parser("run", help="run a topology until its sources finish")
    r.add_argument("file")
    r.add_argument("--transport", choices=["tcp", "sdn"], default="tcp")
    r.add_argument("--hosts", type=int, default=1)
    r.add_argument("--duration", type=float, default=None, help="seconds, then drain sources")
    r.add_argument("--report", help="write the JSON report here ('-': to stdout)")
    r.add_argument("--batch-size", type=int, help=batching.help_text("batch_size"))
    r.add_argument("--max-delay-ms", type=float, help=batching.help_text("max_delay_ms"))
    r.add_argument("--arg", action="append", metavar="NODE.ARG=VALUE", help="override an argument")
    r.add_argument("-q", "--quiet", action="store_true", help="no live rates")
    r.add_argument(
        "--scale",
        action="append",
        metavar="AT:NODE=N",
        help="tcp: at AT seconds, rescale NODE to N workers; keyed state moves with its "
        "key groups (docs/keyed_state.md); repeatable",
    )
    for verb, what in (
        ("unchain", "put NODE's chained edges on a tcp connection, each process kept"),
        ("chain", "make NODE's unchained edges function calls again"),
    ):
        r.add_argument(
            f"--{verb}",
            action="append",
            metavar="AT:NODE[:WORKER]",
            help=f"tcp: at AT seconds, {what} (only WORKER's chain instance when given; "
            "docs/reconfiguration.md, 'Unchaining live'); repeatable",
        )
    r.add_argument(
        "--locality",
        metavar="AT",
        help="tcp: at AT seconds, run the locality router once: the counting node's pairs, "
        "then two direct reroutes that move the pinned keys with their state "
        "(docs/locality.md)",
    )
    r.add_argument(
        "--control",
        metavar="HOST:PORT|off",
        help="tcp: where the run's control endpoint listens, which `typhoon unchain|chain|"
        "scale|route|swap NAME ...` reach with the run's own token (default 127.0.0.1:0, any "
        "free port; docs/usage.md, 'Changing a running application')",
    )
    r.add_argument(
        "--fabric",
        choices=["mesh", "line", "star"],
        default="mesh",
        help="sdn: how emulated hosts are linked",
    )
    r.add_argument("--bw", type=float, default=None, help="sdn: link bandwidth in Mbit/s")
    r.add_argument("--delay", default=None, help="sdn: link delay, e.g. 1ms")
    r.add_argument(
        "--app",
        action="append",
        metavar="apps/APP.py",
        help="sdn: control-plane app to load into the controller",
    )
    r.add_argument(
        "--socket-buffer",
        type=int,
        default=None,
        metavar="BYTES",
        help="sdn: net.core.rmem_default during the run (default 4 MiB): what each "
        "switch port queues, shared by flow control (docs/flow_control.md)",
    )
    r.add_argument(
        "--mtu",
        type=int,
        default=None,
        metavar="BYTES",
        help="sdn: MTU of the emulated fabric links, which worker frames follow "
        "(default: 9000-byte frames on jumbo links; 1450 is VXLAN on a 1500 underlay)",
    )
    r.add_argument(
        "--workdir",
        help="keep worker specs, logs and reports in WORKDIR/NAME/ (sdn also the "
        "coordinator and controller/agent logs)",
    )
    r.set_defaults(func=cmd_run)
    ctl.add_parsers(sub)  # typhoon submit|list|status|scale|...|move|kill (REST)

    debug_cli.add_parser(sub)  # typhoon debug attach|detach|list|tuples (live debugger)
    bench_cli.add_parser(sub)  # typhoon bench: the paper's experiments (benchmarks/)
    cluster_cli.add_parser(sub)  # typhoon cluster apply|check|show FILE (real hosts)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_format:
        os.environ[logs.ENV] = args.log_format  # workers, agents and drivers inherit it
    try:
        logs.setup(
            logging.DEBUG if args.verbose else logging.WARNING,
            text_format="%(levelname)s %(name)s: %(message)s",
        )
    except ValueError as e:  # a bad $TYPHOON_LOG_FORMAT
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except (TopologyError, UsageError, ClusterFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (RuntimeError, ManagerError, CoordinatorError) as e:  # could not start or finish
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
