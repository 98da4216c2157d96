"""Read a bridge's rules with ``ovs-ofctl dump-flows`` as :class:`RuleSpec` values.

Integration tests compare what the switch really holds with what the pure
compiler says it should hold, independently of the controller's own reading
of the switch.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from controller.rules.flows import OFPP_CONTROLLER, RuleSpec

_FIELD = {"in_port": "in_port", "dl_src": "eth_src", "dl_dst": "eth_dst", "dl_type": "eth_type"}


@dataclass(frozen=True)
class Flow:
    spec: RuleSpec
    n_packets: int
    duration: float


def _action(text: str) -> tuple:
    if text.startswith("output:"):
        return ("output", int(text.split(":", 1)[1]))
    if text.startswith("CONTROLLER"):
        return ("output", OFPP_CONTROLLER)
    if text.startswith("group:"):
        return ("group", int(text.split(":", 1)[1]))
    if text.startswith("meter:"):  # instructions, in RuleSpec's action list too
        return ("meter", int(text.split(":", 1)[1]))
    if text.startswith("goto_table:"):
        return ("goto_table", int(text.split(":", 1)[1]))
    m = re.fullmatch(r"(?:set_field:|mod_dl_dst:)([0-9a-f:]{17})(?:->eth_dst)?", text)
    if m:
        return ("set_eth_dst", m.group(1))
    return ("unknown", text)


def parse_flow(line: str) -> Flow:
    head, _, actions = line.strip().partition(" actions=")
    fields = dict(
        part.split("=", 1) if "=" in part else (part, "")
        for part in re.split(r",\s*|\s+", head.strip())
        if part
    )
    match = []
    for key, name in _FIELD.items():
        if key in fields:
            value = fields[key]
            match.append((name, int(value, 0) if name in ("in_port", "eth_type") else value))
    acts = () if actions in ("drop", "") else tuple(_action(a) for a in actions.split(","))
    spec = RuleSpec(
        priority=int(fields.get("priority", 32768)),
        match=tuple(match),
        actions=acts,
        cookie=int(fields["cookie"], 16),
        table_id=int(fields.get("table", 0)),
    )
    return Flow(spec, int(fields.get("n_packets", 0)), float(fields["duration"].rstrip("s")))


def dump_flows(bridge: str) -> list[Flow]:
    out = subprocess.run(
        ["ovs-ofctl", "-O", "OpenFlow13", "--no-names", "dump-flows", bridge],
        capture_output=True,
        text=True,
        check=True,
        timeout=20,
    ).stdout
    return [parse_flow(line) for line in out.splitlines() if "cookie=" in line]
