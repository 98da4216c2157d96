"""The control class on a shaped emulated fabric link, with the kernel's own counters.

``FabricPlan(control_queue=True)`` must leave every fabric interface with the
control and data classes under Mininet's rate class, and the u32 filters must
put a receiver's credit frames (GRANT) into the control class and data frames
and SYNCs into the data class.  Frames are written on the fabric interface
with a packet socket, as ``ovs-vswitchd``'s userspace datapath writes them.
"""

from __future__ import annotations

import re
import secrets
import socket
import subprocess

from mininet_env.fabric import FabricPlan
from mininet_env.network import EmulatedNetwork
from typhoon import control_queue as cq
from typhoon import wire
from typhoon.runtime import links as lk
from typhoon.wire import Kind

A, B = wire.worker_mac(9, 1), wire.worker_mac(9, 2)


def sent_packets(iface: str) -> dict[str, int]:
    out = subprocess.run(
        ["tc", "-s", "class", "show", "dev", iface], capture_output=True, text=True, check=True
    ).stdout
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"class htb (\S+) .*?\n\s*Sent \d+ bytes (\d+) pkt", out)
    }


def test_credit_frames_take_the_control_class_of_a_shaped_link(ovs) -> None:
    plan = FabricPlan(hosts=2, prefix=f"ty{secrets.token_hex(2)}q", bw_mbit=200,
                      control_queue=True)  # fmt: skip
    net = EmulatedNetwork(plan, controller_port=1)
    try:
        net.start()
        assert net.net is not None
        iface = net.net.links[0].intf1.name
        control, data = cq.classes(cq.LinkQueueing(iface, 200))
        before = sent_packets(iface)
        assert control in before and data in before, before
        grant = [wire.encode_credit(v) for v in (0, 5, 6)]
        frames = (
            [wire.pack_frames(B, A, Kind.CREDIT, lk.GRANT, i, grant)[0] for i in range(100)]
            + [wire.pack_frames(B, A, Kind.CREDIT, lk.SYNC, i, grant[:2])[0] for i in range(50)]
            + [wire.pack_frames(B, A, Kind.DATA, 3, i, [b"\x91\x91\x01"])[0] for i in range(100)]
        )
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
            s.bind((iface, 0))
            for f in frames:
                s.send(f)
        after = sent_packets(iface)
    finally:
        net.stop()
    assert after[control] - before[control] == 100
    assert after[data] - before[data] >= 150  # SYNCs and data (and whatever else the link sent)
