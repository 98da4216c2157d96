"""What a host's bridge must look like, as ``ovs-vsctl`` commands and as a check.

Pure: :func:`bridge_plan` turns a :class:`~typhoon.cluster_file.ClusterFile`
and what the host's Open vSwitch holds now (:class:`BridgeState`) into the
argument vectors that make the bridge right, and :func:`problems` compares
the two and says what is wrong in one sentence each.  Reading OVS and running
the commands is :mod:`typhoon.host_setup`'s job.

Every command is idempotent (``--may-exist``, ``set``), so applying the same
file twice changes nothing; a tunnel port of ours (``tyt*``) that the file no
longer names is removed.  With ``fabric.ipsec`` every tunnel also gets
``options:psk`` (Open vSwitch's ``ovs-monitor-ipsec`` then encrypts it); the
key appears in printed commands only as :data:`HIDDEN` (:func:`shown`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typhoon.cluster_file import TUNNEL_PREFIX, ClusterFile, HostEntry

OPENFLOW = "OpenFlow13"
VSCTL = "ovs-vsctl"
PSK_OPTION = "options:psk="
HIDDEN = "(the key of fabric.ipsec.psk_file)"


def shown(argv: list[str]) -> list[str]:
    """``argv`` as it may be printed: a pre-shared key replaced by :data:`HIDDEN`."""
    return [PSK_OPTION + HIDDEN if a.startswith(PSK_OPTION) else a for a in argv]


@dataclass(frozen=True)
class PortState:
    """One interface on the bridge as OVS reports it."""

    name: str
    type: str = ""  # "" (system), "vxlan", "geneve", "internal", ...
    ofport: int | None = None
    options: dict[str, str] = field(default_factory=dict)
    mtu: int | None = None  # what the interface has now
    error: str = ""


@dataclass
class BridgeState:
    """A host's bridge as found (``exists=False``: no such bridge)."""

    name: str
    exists: bool = False
    dpid: int | None = None
    datapath_type: str = ""
    fail_mode: str = ""
    protocols: list[str] = field(default_factory=list)
    controllers: list[str] = field(default_factory=list)
    connected: bool | None = None  # some controller connected (None: unknown)
    ports: dict[str, PortState] = field(default_factory=dict)
    # IP MTU of the interface that carries traffic to each peer address (tunnels)
    underlay_mtu: dict[str, int] = field(default_factory=dict)


def _datapath_type(h: HostEntry) -> str:
    return "netdev" if h.datapath == "netdev" else "system"


def bridge_plan(
    cf: ClusterFile, host: str, state: BridgeState | None = None, psk: str | None = None
) -> list[list[str]]:
    """``ovs-vsctl`` argument vectors that give ``host`` the bridge the file describes
    (``psk``: the key of ``fabric.ipsec``, read by the caller; None: no IPsec)."""
    h = cf.hosts[host]
    br = h.bridge
    cmds: list[list[str]] = [
        [VSCTL, "--may-exist", "add-br", br, "--", "set", "Bridge", br,
         f"datapath_type={_datapath_type(h)}",
         f"other-config:datapath-id={h.dpid:016x}",
         f"protocols={OPENFLOW}",
         "fail_mode=secure"],
    ]  # fmt: skip
    # set-controller replaces the Controller rows, which drops the connection: only
    # when the targets differ
    if state is None or sorted(state.controllers) != sorted(cf.controllers):
        cmds.append([VSCTL, "set-controller", br, *cf.controllers])
    wanted: set[str] = set()
    for t in cf.tunnels(host):
        wanted.add(t.name)
        cmds.append(
            [VSCTL, "--may-exist", "add-port", br, t.name, "--", "set", "Interface", t.name,
             f"type={cf.fabric_type}",
             f"options:remote_ip={t.remote_ip}",
             f"options:local_ip={t.local_ip}",
             f"options:key={cf.key}",
             f"ofport_request={t.port}",
             *([PSK_OPTION + psk] if psk is not None else [])]
        )  # fmt: skip
        old = state.ports.get(t.name) if state is not None else None
        if psk is None and old is not None and "psk" in old.options:  # IPsec turned off
            cmds.append([VSCTL, "remove", "Interface", t.name, "options", "psk"])
    for p in cf.fabric_ports(host):
        wanted.add(p.interface)
        cmds.append(
            [VSCTL, "--may-exist", "add-port", br, p.interface, "--", "set", "Interface",
             p.interface, f"ofport_request={p.port}", f"mtu_request={cf.mtu}"]
        )  # fmt: skip
    if state is not None and state.exists:
        for name in sorted(state.ports):
            if name.startswith(TUNNEL_PREFIX) and name not in wanted:
                cmds.append([VSCTL, "--if-exists", "del-port", br, name])
    return cmds


def problems(cf: ClusterFile, host: str, state: BridgeState, psk: str | None = None) -> list[str]:
    """What differs between ``state`` and the file, one sentence each (empty: all good);
    ``psk``: the key every tunnel must have with ``fabric.ipsec``."""
    h = cf.hosts[host]
    br = h.bridge
    if not state.exists:
        return [f"bridge {br} missing (run: typhoon cluster apply {cf.source} --host {host})"]
    out: list[str] = []
    if state.dpid != h.dpid:
        have = "none" if state.dpid is None else f"{state.dpid:#x}"
        out.append(f"bridge {br} has DPID {have}, the file says {h.dpid:#x}")
    if state.datapath_type and state.datapath_type != _datapath_type(h):
        out.append(f"bridge {br} datapath_type is {state.datapath_type}, "
                   f"the file says {_datapath_type(h)}")  # fmt: skip
    if state.fail_mode != "secure":
        out.append(f"bridge {br} fail_mode is {state.fail_mode or 'unset'}, not secure")
    if OPENFLOW not in state.protocols:
        out.append(f"bridge {br} does not speak {OPENFLOW} (protocols: "
                   f"{','.join(state.protocols) or 'default'})")  # fmt: skip
    if sorted(state.controllers) != sorted(cf.controllers):
        out.append(f"bridge {br} controller is {','.join(state.controllers) or 'unset'}, "
                   f"the file says {','.join(cf.controllers)}")  # fmt: skip
    elif state.connected is False:
        out.append(f"bridge {br} is not connected to its controller {','.join(cf.controllers)}")
    for t in cf.tunnels(host):
        p = state.ports.get(t.name)
        where = f"tunnel {t.name} to {t.peer}"
        if p is None:
            out.append(f"{where} missing")
            continue
        if p.type != cf.fabric_type:
            out.append(f"{where} is of type {p.type or 'system'}, not {cf.fabric_type}")
        if p.options.get("remote_ip") != t.remote_ip:
            out.append(f"{where} has remote_ip {p.options.get('remote_ip')}, not {t.remote_ip}")
        if p.ofport != t.port:
            out.append(f"{where} is OpenFlow port {p.ofport}, not {t.port}")
        if p.error:
            out.append(f"{where}: {p.error}")
        if psk is not None and p.options.get("psk") != psk:
            out.append(f"{where} is not IPsec with the key of {cf.ipsec_psk_file} (run apply)")
        elif psk is None and "psk" in p.options:
            out.append(f"{where} has an IPsec key the file does not set (run apply)")
        mtu = state.underlay_mtu.get(t.remote_ip)
        if mtu is not None and mtu < cf.mtu:
            out.append(f"MTU too small: the path to {t.peer} ({t.remote_ip}) has MTU {mtu}, "
                       f"the fabric needs {cf.mtu}")  # fmt: skip
    for fp in cf.fabric_ports(host):
        p = state.ports.get(fp.interface)
        where = f"fabric port {fp.interface} to {fp.peer}"
        if p is None:
            out.append(f"{where} missing")
            continue
        if p.ofport != fp.port:
            out.append(f"{where} is OpenFlow port {p.ofport}, not {fp.port}")
        if p.error:
            out.append(f"{where}: {p.error}")
        if p.mtu is not None and p.mtu < cf.mtu:
            out.append(f"MTU too small: {fp.interface} has MTU {p.mtu}, the fabric needs {cf.mtu}")
    wanted = {t.name for t in cf.tunnels(host)}
    for name in sorted(state.ports):
        if name.startswith(TUNNEL_PREFIX) and name not in wanted:
            out.append(f"tunnel {name} is not in the file (apply removes it)")
    return out
