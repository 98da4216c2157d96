"""What each bridge of a fabric did during one run: OpenFlow rules hit, frames, datapath flows.

A tuple that crosses an intermediate bridge costs that bridge's datapath a
lookup per *frame*; whether it costs more (a slow-path upcall, a trip to the
controller, a rule per tuple) shows in three numbers per bridge, read here
with the OVS tools (no Ryu):

* the frames and bytes that arrived at the bridge over fabric links (the
  kernel counters of its veth ends whose peer belongs to another bridge of the
  fabric), before and after the run: on an intermediate bridge, the transit;
* the OpenFlow data rules (priority 100, the controller's data/credit rules or
  the tcp baseline's per-MAC rules), sampled while the run goes (an
  application's rules leave with it): the most installed at once, and how many
  of them matched a frame during the run;
* the datapath flows (megaflows) whose input port is on the bridge, sampled
  the same way (the most seen at once; a worker's port, and its flows, go
  when the run ends);
* the userspace datapath's ``missed`` counter (upcalls) before and after, for
  the whole datapath: other bridges on this machine count there too.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DATA_PRIORITY = 100
_OF_LINE = re.compile(r"n_packets=(\d+).*?priority=(\d+),?([^ ]*)")
_DP_PORT = re.compile(r"in_port\(([^)]+)\)")
_DP_PACKETS = re.compile(r"packets:(\d+)")
_MISSED = re.compile(r"netdev@ovs-netdev: hit:(\d+) missed:(\d+)")


def parse_of_rules(text: str) -> dict[str, int]:
    """``ovs-ofctl dump-flows`` text -> {match of each priority-100 rule: n_packets}."""
    rules = {}
    for line in text.splitlines():
        m = _OF_LINE.search(line)
        if m and int(m.group(2)) == DATA_PRIORITY:
            rules[m.group(3)] = int(m.group(1))
    return rules


def parse_dp_flows(text: str, ports: dict[str, str]) -> dict[str, tuple[int, int]]:
    """``ovs-appctl dpctl/dump-flows --names`` text -> {bridge: (flows, packets)} for the
    flows whose input port is in ``ports`` (port name -> bridge)."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        port = _DP_PORT.search(line)
        if port is None or port.group(1) not in ports:
            continue
        packets = _DP_PACKETS.search(line)
        bridge = ports[port.group(1)]
        flows, total = out.get(bridge, (0, 0))
        out[bridge] = (flows + 1, total + (int(packets.group(1)) if packets else 0))
    return out


def parse_missed(text: str) -> int | None:
    """``ovs-appctl dpif/show`` text -> the userspace datapath's upcall (missed) count."""
    m = _MISSED.search(text)
    return int(m.group(2)) if m else None


@dataclass
class BridgeFlows:
    """One bridge during one run."""

    bridge: str
    rules: int  # priority-100 rules seen during the run (sampled)
    rules_hit: int  # of them, those seen matching a frame during the run
    frames: int  # frames that arrived over fabric links during the run
    frame_bytes: int  # their bytes
    dp_flows: int  # datapath flows from its ports (the most at one sample)
    dp_packets: int  # packets those datapath flows matched (the most at one sample)


def _ovs(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    return proc.stdout if proc.returncode == 0 else ""


def _of_rules(bridge: str) -> dict[str, int]:
    return parse_of_rules(_ovs("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge))


def _sys(name: str, item: str) -> int | None:
    try:
        return int(Path(f"/sys/class/net/{name}/{item}").read_text())
    except (OSError, ValueError):
        return None


def fabric_ports(bridges: list[str]) -> dict[str, list[str]]:
    """Bridge -> its ports that are veth ends whose peer is a port of another of ``bridges``."""
    ports = {b: _ovs("ovs-vsctl", "list-ports", b).split() for b in bridges}
    owner = {_sys(p, "ifindex"): b for b, names in ports.items() for p in names}
    out: dict[str, list[str]] = {}
    for b, names in ports.items():
        out[b] = [p for p in names if owner.get(_sys(p, "iflink"), b) != b]
    return out


def link_counters(ports: dict[str, list[str]]) -> dict[str, tuple[int, int]]:
    """Bridge -> (frames, bytes) received so far on its fabric ports."""
    out = {}
    for b, names in ports.items():
        stats = [(_sys(p, "statistics/rx_packets"), _sys(p, "statistics/rx_bytes")) for p in names]
        out[b] = (sum(f or 0 for f, _ in stats), sum(n or 0 for _, n in stats))
    return out


class FlowWatch:
    """Sample the OpenFlow counters of ``bridges`` while a run goes; ``stop`` gives
    one :class:`BridgeFlows` per bridge and the datapath's upcalls during the run."""

    def __init__(self, bridges: Iterable[str], every: float = 0.5) -> None:
        self.bridges = list(bridges)
        self.every = every
        self.before = {b: _of_rules(b) for b in self.bridges}
        self.links = fabric_ports(self.bridges)
        self.link0 = link_counters(self.links)
        self.peak: dict[str, dict[str, int]] = {b: {} for b in self.bridges}
        self.dp_peak: dict[str, tuple[int, int]] = {}
        self.missed0 = parse_missed(_ovs("ovs-appctl", "dpif/show"))
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="flow-watch", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        for b in self.bridges:
            for rule, n in _of_rules(b).items():
                self.peak[b][rule] = max(n, self.peak[b].get(rule, 0))
        ports = {p: b for b in self.bridges for p in _ovs("ovs-vsctl", "list-ports", b).split()}
        dp = parse_dp_flows(_ovs("ovs-appctl", "dpctl/dump-flows", "--names"), ports)
        for b, (flows, packets) in dp.items():
            old = self.dp_peak.get(b, (0, 0))
            self.dp_peak[b] = (max(flows, old[0]), max(packets, old[1]))

    def _loop(self) -> None:
        while not self._done.wait(self.every):
            self._sample()

    def stop(self) -> tuple[list[BridgeFlows], int | None]:
        self._done.set()
        self._thread.join()
        self._sample()
        missed1 = parse_missed(_ovs("ovs-appctl", "dpif/show"))
        link1 = link_counters(self.links)
        out = []
        for b in self.bridges:
            grown = {r: n - self.before[b].get(r, 0) for r, n in self.peak[b].items()}
            flows, packets = self.dp_peak.get(b, (0, 0))
            frames = link1[b][0] - self.link0[b][0]
            nbytes = link1[b][1] - self.link0[b][1]
            hit = sum(1 for n in grown.values() if n > 0)
            out.append(BridgeFlows(b, len(grown), hit, frames, nbytes, flows, packets))
        missed = None
        if missed1 is not None and self.missed0 is not None:
            missed = missed1 - self.missed0
        return out, missed


def as_records(flows: list[BridgeFlows]) -> list[dict[str, Any]]:
    return [asdict(f) for f in flows]
