"""The acting side of a cluster file on one host: read OVS, run the plan, record it.

:mod:`typhoon.bridge_plan` and :mod:`typhoon.fabric_guard` decide; this
module only runs ``ovs-vsctl``, ``ip``, ``nft`` and ``tc`` with argument vectors
(never a shell; nft scripts go in on stdin; ``tc``'s come from
:mod:`typhoon.control_queue`), reads the IPsec key file, opens a TCP
connection to the controller, and writes the coordinator.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typhoon import control_queue, fabric_guard
from typhoon.bridge_plan import VSCTL, BridgeState, PortState, bridge_plan, problems, shown
from typhoon.cluster_file import ClusterFile
from typhoon.coordinator import Coordinator
from typhoon.private_files import SecretFileError, read_secret

SYS_NET = Path("/sys/class/net")
KERNEL_MODULE = Path("/sys/module/openvswitch")  # loaded (or built in) kernel datapath
TIMEOUT = 10.0
# where Debian's openvswitch-ipsec puts the daemon that turns options:psk into IPsec
IPSEC_MONITOR = ("ovs-monitor-ipsec", "/usr/share/openvswitch/scripts/ovs-monitor-ipsec")


class HostSetupError(RuntimeError):
    """A command that configures or inspects the host failed."""


def _run(
    argv: list[str], check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, input=stdin)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HostSetupError(f"{' '.join(shown(argv))}: {e}") from e
    if check and proc.returncode != 0:
        raise HostSetupError(
            f"{' '.join(shown(argv))} exited {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc


def _vsctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ovs-vsctl", f"--timeout={int(TIMEOUT)}", *args], check=check)


def local_host(cf: ClusterFile) -> str:
    """The file's host whose address this machine has, else the one named like it."""
    proc = _run(["ip", "-j", "addr", "show"], check=False)
    addresses: set[str] = set()
    if proc.returncode == 0:
        for link in json.loads(proc.stdout or "[]"):
            for a in link.get("addr_info", []):
                addresses.add(str(ipaddress.ip_address(a["local"])))
    mine = [h.name for h in cf.hosts.values() if h.address in addresses]
    if len(mine) == 1:
        return mine[0]
    name = socket.gethostname().split(".")[0]
    if name in cf.hosts:
        return name
    raise HostSetupError(
        "cannot tell which host of the file this machine is (none of its addresses "
        "is here and the hostname matches no host): pass --host NAME"
    )


def _ovs_value(v: Any) -> Any:
    """One cell of ``ovs-vsctl --format=json``: ["set", [...]], ["map", [[k, v]]], scalar."""
    if isinstance(v, list) and len(v) == 2 and v[0] == "set":
        return [_ovs_value(x) for x in v[1]]
    if isinstance(v, list) and len(v) == 2 and v[0] == "map":
        return {k: x for k, x in v[1]}
    if isinstance(v, list) and len(v) == 2 and v[0] == "uuid":
        return v[1]
    return v


def _table(table: str, columns: list[str]) -> list[dict[str, Any]]:
    proc = _vsctl("--format=json", f"--columns={','.join(columns)}", "list", table)
    doc = json.loads(proc.stdout)
    return [
        dict(zip(doc["headings"], (_ovs_value(c) for c in row), strict=True)) for row in doc["data"]
    ]


def _single(v: Any) -> Any:
    """An optional column: [] when unset, else the value."""
    if isinstance(v, list):
        return v[0] if v else None
    return v


def read_state(cf: ClusterFile, host: str) -> BridgeState:
    """The host's bridge as Open vSwitch has it now."""
    br = cf.hosts[host].bridge
    state = BridgeState(br)
    if _vsctl("br-exists", br, check=False).returncode != 0:
        return state
    state.exists = True
    row = next(r for r in _table("Bridge", ["name", "datapath_id", "datapath_type", "fail_mode",
                                            "protocols", "controller", "ports"])
               if r["name"] == br)  # fmt: skip
    dpid = _single(row["datapath_id"])
    state.dpid = int(dpid, 16) if dpid else None
    state.datapath_type = row["datapath_type"] or "system"
    state.fail_mode = _single(row["fail_mode"]) or ""
    state.protocols = list(row["protocols"]) if isinstance(row["protocols"], list) else [
        row["protocols"]]  # fmt: skip
    controllers = row["controller"] if isinstance(row["controller"], list) else [row["controller"]]
    if controllers:
        ctl = {r["_uuid"]: r for r in _table("Controller", ["_uuid", "target", "is_connected"])}
        mine = [ctl[u] for u in controllers if u in ctl]
        state.controllers = [r["target"] for r in mine]
        state.connected = any(r["is_connected"] is True for r in mine)
    names = set(_vsctl("list-ifaces", br).stdout.split())
    for r in _table("Interface", ["name", "type", "ofport", "options", "mtu", "error"]):
        if r["name"] in names:
            state.ports[r["name"]] = PortState(
                r["name"], r["type"], _single(r["ofport"]), dict(r["options"]),
                _single(r["mtu"]), _single(r["error"]) or "",
            )  # fmt: skip
    for t in cf.tunnels(host):
        mtu = underlay_mtu(t.remote_ip)
        if mtu is not None:
            state.underlay_mtu[t.remote_ip] = mtu
    return state


def underlay_mtu(address: str) -> int | None:
    """MTU of the interface the kernel routes ``address`` through (None: no route)."""
    proc = _run(["ip", "-j", "route", "get", address], check=False)
    if proc.returncode != 0:
        return None
    routes = json.loads(proc.stdout or "[]")
    dev = routes[0].get("dev") if routes else None
    if not dev:
        return None
    try:
        return int((SYS_NET / dev / "mtu").read_text())
    except (OSError, ValueError):
        return None


def controller_problems(cf: ClusterFile, timeout: float = 2.0) -> list[str]:
    """One sentence per controller this host cannot open a TCP connection to."""
    out = []
    for target in cf.controllers:
        _, rest = target.split(":", 1)
        addr, _, port = rest.rpartition(":")
        try:
            socket.create_connection((addr.strip("[]"), int(port)), timeout=timeout).close()
        except OSError as e:
            out.append(f"controller {target} unreachable: {e.strerror or e}")
    return out


def without_datapath(state: BridgeState, found: list[str]) -> list[str]:
    """A bridge Open vSwitch gave no datapath: that one cause, said first, instead of its
    consequences (no DPID, tunnels without an OpenFlow port)."""
    if not state.exists or state.dpid is not None:
        return found
    br = state.name
    if state.datapath_type == "system" and not KERNEL_MODULE.exists():
        cause = (
            f"bridge {br} has no datapath: datapath: system needs the openvswitch kernel "
            "module, which is not loaded on this host (modprobe openvswitch); or set "
            "datapath: netdev for this host in the cluster file (Open vSwitch's userspace "
            "datapath: tunnels then need the underlay address on a bridge of its own, "
            "br-phy, docs/deploy.md section 2)"
        )
    else:
        cause = (
            f"bridge {br} has no datapath: Open vSwitch could not create its "
            f"{state.datapath_type or 'system'} datapath (see ovs-vswitchd.log)"
        )
    rest = [p for p in found if "has DPID" not in p and "OpenFlow port None" not in p]
    return [cause, *rest]


# ----- the fabric's protection (typhoon/fabric_guard.py) -----------------------------------


def nft_found() -> bool:
    return shutil.which(fabric_guard.NFT) is not None


def ipsec_found() -> bool:
    return any(shutil.which(p) or Path(p).is_file() for p in IPSEC_MONITOR)


def ipsec_key(cf: ClusterFile) -> str | None:
    """The pre-shared key of ``fabric.ipsec`` (None without it); HostSetupError if unusable."""
    if not cf.ipsec:
        return None
    try:
        return read_secret(cf.ipsec_psk_file, "fabric.ipsec.psk_file")  # type: ignore[arg-type]
    except SecretFileError as e:
        raise HostSetupError(str(e)) from e


def read_firewall() -> fabric_guard.FirewallState | None:
    """The fabric table as nft shows it (None: nft missing); ``exists=False``: no table."""
    if not nft_found():
        return None
    argv = [fabric_guard.NFT, "-j", "list", "table", fabric_guard.FAMILY, fabric_guard.TABLE]
    proc = _run(argv, check=False)
    if proc.returncode != 0:
        return fabric_guard.FirewallState()
    return fabric_guard.parse_listing(proc.stdout)


def guard_refusal(cf: ClusterFile) -> str | None:
    """Why this host cannot have the protection the file asks for, else None."""
    if not cf.tunneled:
        return None
    if cf.firewall and not nft_found():
        return fabric_guard.nft_missing(cf)
    if cf.ipsec and not ipsec_found():
        return (
            "fabric.ipsec needs Open vSwitch's IPsec support (ovs-monitor-ipsec, Debian "
            "package openvswitch-ipsec), which this host lacks: install it, or remove "
            f"fabric.ipsec from {cf.source}"
        )
    return None


def protection(cf: ClusterFile, host: str, state: BridgeState | None = None) -> str:
    """One sentence: the protection active on this host's fabric now."""
    fw = read_firewall() if cf.tunneled else None
    firewall_ok = (
        fw is not None and fw.exists and not fabric_guard.firewall_problems(cf, host, fw, True)
    )
    tunnels = cf.tunnels(host)
    state = state or read_state(cf, host)
    keyed = bool(tunnels) and all(
        t.name in state.ports and state.ports[t.name].options.get("psk") for t in tunnels
    )
    dropped = fw.dropped if fw is not None else 0
    return fabric_guard.protection(cf, host, firewall_ok, keyed and ipsec_found(), dropped)


def install_guard(cf: ClusterFile, host: str) -> list[list[str]]:
    """The fabric filter the file asks for, in one nft transaction (the commands run).

    Opted out (``fabric.firewall: false``): a table left by an earlier apply goes."""
    if not cf.tunneled or not (cf.firewall or nft_found()):
        return []
    script = fabric_guard.ruleset(cf, host) if cf.firewall else fabric_guard.removal()
    argv = [fabric_guard.NFT, "-f", "-"]
    _run(argv, stdin=script)
    return [argv]


def remove_guard() -> list[list[str]]:
    """Remove the fabric filter (nothing to remove is fine)."""
    if not nft_found():
        return []
    argv = [fabric_guard.NFT, "-f", "-"]
    _run(argv, stdin=fabric_guard.removal())
    return [argv]


# ----- credit frames ahead of data on the underlay (typhoon/control_queue.py) -------------


def fabric_interface(cf: ClusterFile, host: str) -> str | None:
    """The interface this host's tunnel packets leave by (None: no peer to send to): the
    one the kernel routes the first peer through or, when that is an OVS bridge (the
    userspace datapath's ``br-phy``), that bridge's one physical port."""
    tunnels = cf.tunnels(host)
    if not tunnels:
        return None
    proc = _run(["ip", "-j", "route", "get", tunnels[0].remote_ip], check=False)
    routes = json.loads(proc.stdout or "[]") if proc.returncode == 0 else []
    dev = routes[0].get("dev") if routes else None
    if not dev or not control_queue.valid_iface(dev):
        raise HostSetupError(f"no route to {tunnels[0].peer} ({tunnels[0].remote_ip})")
    if _vsctl("br-exists", dev, check=False).returncode != 0:
        return dev
    names = set(_vsctl("list-ifaces", dev).stdout.split())
    physical = sorted(
        r["name"] for r in _table("Interface", ["name", "type"])
        if r["name"] in names and r["type"] in ("", "system")
    )  # fmt: skip
    if len(physical) != 1 or not control_queue.valid_iface(physical[0]):
        raise HostSetupError(
            f"the route to {tunnels[0].peer} goes through OVS bridge {dev}, which has "
            f"{len(physical)} physical ports ({', '.join(physical) or 'none'}), not one: "
            "cannot tell which interface to give the control class"
        )
    return physical[0]


def control_link(cf: ClusterFile, host: str) -> control_queue.LinkQueueing | None:
    """The control class the file asks for on this host (None: none asked, or no peer)."""
    if cf.control_rate_mbit is None:
        return None
    iface = fabric_interface(cf, host)
    if iface is None:
        return None
    return control_queue.tunnel_queueing(
        iface, cf.control_rate_mbit, cf.fabric_type, cf.ip_version()
    )


def _tc_listings(link: control_queue.LinkQueueing) -> tuple[str, str, str]:
    dev = link.iface
    return (
        _run(["tc", "qdisc", "show", "dev", dev]).stdout,
        _run(["tc", "-s", "class", "show", "dev", dev]).stdout,
        _run(["tc", "filter", "show", "dev", dev, "parent", link.root], check=False).stdout,
    )


def control_class_problems(link: control_queue.LinkQueueing) -> list[str]:
    return control_queue.problems(link, *_tc_listings(link))


def control_class_status(cf: ClusterFile, host: str) -> str | None:
    """One sentence for apply and check: where the control class is and what went through
    it (None: the file asks for none)."""
    if cf.control_rate_mbit is None:
        return None
    try:
        link = control_link(cf, host)
    except HostSetupError as e:
        return f"control class: none: {e}"
    if link is None:
        return "control class: none: this host has no tunnel"
    qdiscs, class_listing, filters = _tc_listings(link)
    if control_queue.problems(link, qdiscs, class_listing, filters):
        return f"control class: not installed on {link.iface}"
    control, data = control_queue.classes(link)
    sent = control_queue.class_packets(class_listing)
    return (
        f"control class: credit frames ahead of data on {link.iface} (htb "
        f"{link.rate_mbit:g} Mbit/s; packets sent: control {control} {sent.get(control, 0)}, "
        f"data {data} {sent.get(data, 0)})"
    )


def install_control_class(cf: ClusterFile, host: str) -> list[list[str]]:
    """The control class the file asks for (the commands run; none if it is there already).
    The interface's root qdisc is replaced."""
    link = control_link(cf, host)
    if link is None or not control_class_problems(link):
        return []
    _run(control_queue.removal(link), check=False)  # no qdisc of ours yet: nothing to remove
    commands = control_queue.host_commands(link)
    for argv in commands:
        _run(argv)
    return commands


def remove_control_class(cf: ClusterFile, host: str) -> list[list[str]]:
    """Back to the interface's default qdisc, if it holds the control class."""
    try:
        link = control_link(cf, host)
    except HostSetupError:
        return []
    if link is None:
        return []
    qdiscs = _run(["tc", "qdisc", "show", "dev", link.iface]).stdout
    if f"qdisc htb {link.root} root" not in qdiscs:
        return []
    argv = control_queue.removal(link)
    _run(argv)
    return [argv]


@dataclass
class ApplyResult:
    commands: list[list[str]]
    problems: list[str]  # what check still finds afterwards (controller reachability aside)


def apply(cf: ClusterFile, host: str, coordinator: Coordinator | None) -> ApplyResult:
    """Make the host's bridge and fabric filter what the file says, then record the cluster
    and the host.  Refused (HostSetupError) before any change if the host cannot have the
    protection the file asks for."""
    refusal = guard_refusal(cf)
    if refusal is not None:
        raise HostSetupError(refusal)
    psk = ipsec_key(cf)
    commands = bridge_plan(cf, host, read_state(cf, host), psk)
    for argv in commands:
        _run(argv)
    commands += install_guard(cf, host)
    commands += install_control_class(cf, host)
    state = read_state(cf, host)
    left = without_datapath(state, problems(cf, host, state, psk))
    left += fabric_guard.firewall_problems(cf, host, read_firewall(), nft_found())
    link = control_link(cf, host)
    if link is not None:
        left += control_class_problems(link)
    left = [p for p in left if "not connected" not in p]  # the controller may start later
    if coordinator is not None:
        coordinator.put_cluster(cf.cluster())
        h = cf.hosts[host]
        coordinator.put(
            f"hosts/{host}",
            {"address": h.address, "bridge": h.bridge, "dpid": h.dpid, "applied": time.time()},
        )
    return ApplyResult(commands, left)


def teardown(cf: ClusterFile, host: str) -> list[list[str]]:
    """Undo apply on this host: the bridge (with its tunnels) and the fabric filter."""
    done = [[VSCTL, f"--timeout={int(TIMEOUT)}", "--if-exists", "del-br", cf.hosts[host].bridge]]
    _run(done[0])
    return done + remove_guard() + remove_control_class(cf, host)


def _control_class_check(cf: ClusterFile, host: str) -> list[str]:
    try:
        link = control_link(cf, host)
    except HostSetupError as e:
        return [f"control class: {e}"]
    return [] if link is None else control_class_problems(link)


def check(cf: ClusterFile, host: str, coordinator: Coordinator | None = None) -> list[str]:
    """Everything wrong on this host, one sentence each."""
    try:
        psk = ipsec_key(cf)
    except HostSetupError as e:
        psk, unreadable = None, [str(e)]
    else:
        unreadable = []
    refusal = guard_refusal(cf)
    state = read_state(cf, host)
    found = without_datapath(state, problems(cf, host, state, psk))
    if unreadable:  # the key cannot be compared: say why once, not per tunnel
        found = [p for p in found if "IPsec key the file does not set" not in p]
    out = found + controller_problems(cf) + unreadable
    if refusal is not None:
        out.append(refusal)
    elif cf.tunneled:
        out += fabric_guard.firewall_problems(cf, host, read_firewall(), nft_found())
    out += _control_class_check(cf, host)
    if coordinator is not None:
        cluster = coordinator.get_cluster()
        if cluster is None or cluster.to_dict() != cf.cluster().to_dict():
            out.append("the coordinator's cluster differs from the file (run apply)")
    return out
