"""``typhoon cluster apply|check|show|teardown FILE``: a host's bridge, fabric filter and
control class from the operator's cluster file (typhoon/host_setup.py,
typhoon/fabric_guard.py, typhoon/control_queue.py)."""

from __future__ import annotations

import argparse
import json
import shlex

from typhoon import control_queue, fabric_guard, host_setup
from typhoon.bridge_plan import bridge_plan, shown
from typhoon.cluster_file import load_cluster_file
from typhoon.coordinator import CoordinatorError, open_coordinator

EXIT_PROBLEMS = 1


def _host(cf, args: argparse.Namespace) -> str:
    if args.host is None:
        return host_setup.local_host(cf)
    if args.host not in cf.hosts:
        raise host_setup.HostSetupError(
            f"--host {args.host}: not a host of {cf.source} ({', '.join(cf.hosts)})"
        )
    return args.host


def _status(cf, host: str) -> None:
    """The fabric's protection and (when the file asks for it) its control class."""
    print(f"{host}: {host_setup.protection(cf, host)}")
    queueing = host_setup.control_class_status(cf, host)
    if queueing is not None:
        print(f"{host}: {queueing}")


def cmd_show(args: argparse.Namespace) -> int:
    """The file checked, the cluster the controller will see, and one host's plan."""
    cf = load_cluster_file(args.file)
    print(json.dumps(cf.cluster().to_dict(), indent=2))
    if args.host:
        for argv in bridge_plan(cf, _host(cf, args)):
            print(shlex.join(argv))
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    cf = load_cluster_file(args.file)
    host = _host(cf, args)
    if args.dry_run:
        psk = host_setup.ipsec_key(cf)
        for argv in bridge_plan(cf, host, host_setup.read_state(cf, host), psk):
            print(shlex.join(shown(argv)))
        if cf.tunneled and cf.firewall:
            print(f"{fabric_guard.NFT} -f - <<'EOF'\n{fabric_guard.ruleset(cf, host)}EOF")
        link = host_setup.control_link(cf, host)
        if link is not None:
            print(shlex.join(control_queue.removal(link)))
            for argv in control_queue.host_commands(link):
                print(shlex.join(argv))
        return 0
    coordinator = (
        None if args.no_coordinator else open_coordinator(args.coordinator or cf.coordinator)
    )
    try:
        result = host_setup.apply(cf, host, coordinator)
    finally:
        if coordinator is not None:
            coordinator.close()
    for argv in result.commands:
        print(f"ran: {shlex.join(shown(argv))}")
    for p in result.problems:
        print(f"{host}: {p}")
    _status(cf, host)
    if not result.problems:
        print(f"{host}: bridge {cf.hosts[host].bridge} configured")
    return EXIT_PROBLEMS if result.problems else 0


def cmd_check(args: argparse.Namespace) -> int:
    cf = load_cluster_file(args.file)
    host = _host(cf, args)
    coordinator = None
    if not args.no_coordinator:
        try:
            coordinator = open_coordinator(args.coordinator or cf.coordinator)
        except CoordinatorError as e:
            print(f"{host}: coordinator {args.coordinator or cf.coordinator} unusable: {e}")
            return EXIT_PROBLEMS
    try:
        found = host_setup.check(cf, host, coordinator)
    except CoordinatorError as e:
        found = [f"coordinator unreachable: {e}"]
    finally:
        if coordinator is not None:
            coordinator.close()
    _status(cf, host)
    for p in found:
        print(f"{host}: {p}")
    if not found:
        print(f"{host}: ok")
    return EXIT_PROBLEMS if found else 0


def cmd_teardown(args: argparse.Namespace) -> int:
    """Undo apply: this host's bridge (its tunnels) and the fabric filter."""
    cf = load_cluster_file(args.file)
    host = _host(cf, args)
    for argv in host_setup.teardown(cf, host):
        print(f"ran: {shlex.join(argv)}")
    print(f"{host}: bridge {cf.hosts[host].bridge} and the fabric filter removed")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("cluster", help="configure or check this host from a cluster file")
    verbs = c.add_subparsers(dest="verb", required=True)
    for name, func, text in (
        ("apply", cmd_apply, "configure this host's bridge and record it (idempotent)"),
        ("check", cmd_check, "report what is wrong on this host, one line each"),
        ("show", cmd_show, "check the file, print the cluster (and --host's plan)"),
        ("teardown", cmd_teardown, "remove this host's bridge and fabric filter"),
    ):
        v = verbs.add_parser(name, help=text)
        v.add_argument("file")
        v.add_argument("--host", help="which host of the file this is (default: by address)")
        if name in ("apply", "check"):
            v.add_argument("--coordinator", help="override the file's coordinator URL")
            v.add_argument("--no-coordinator", action="store_true",
                           help="do not read or write the coordinator")  # fmt: skip
        if name == "apply":
            v.add_argument("--dry-run", action="store_true", help="print the commands only")
        v.set_defaults(func=func)
