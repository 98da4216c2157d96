"""RuleSpec <-> OpenFlow 1.3 messages: the thin layer between pure rules and Ryu.

Every function takes the datapath and builds messages with its own
`dp.ofproto` / `dp.ofproto_parser`, so this module imports no Ryu at all
(tests hand it a stand-in datapath carrying Ryu's real OpenFlow 1.3 modules).
The contract that makes reconciliation work: a spec installed with `flow_mod`
and read back through `spec_from_stats` compares equal to the original; the
same holds for groups with `group_mod` and `spec_from_group_desc`.
"""

from __future__ import annotations

from typing import Any

from controller.rules.cookies import ALL_MASK, app_mask
from controller.rules.flows import MATCH_FIELDS, OFPP_CONTROLLER, Action, RuleSpec
from controller.rules.groups import Bucket, GroupSpec
from controller.rules.meters import MeterSpec

# OpenFlow 1.3 wire numbers, so reading stats back needs no datapath (checked against Ryu's)
OFPIT_GOTO_TABLE = 1
OFPIT_APPLY_ACTIONS = 4
OFPIT_METER = 6
OFPAT_OUTPUT = 0
OFPAT_GROUP = 22
OFPAT_SET_FIELD = 25

_COMMANDS = {"add": "OFPFC_ADD", "modify": "OFPFC_MODIFY_STRICT", "delete": "OFPFC_DELETE_STRICT"}
_GROUP_COMMANDS = {"add": "OFPGC_ADD", "modify": "OFPGC_MODIFY", "delete": "OFPGC_DELETE"}
GROUP_TYPES = {"all": 0, "select": 1, "indirect": 2, "ff": 3}  # OpenFlow 1.3 wire numbers


def _action(dp: Any, action: Action) -> Any:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    name, arg = action
    if name == "output":
        # only packets to the controller carry max_len; send them whole, never buffered
        max_len = ofp.OFPCML_NO_BUFFER if arg == OFPP_CONTROLLER else 0
        return parser.OFPActionOutput(arg, max_len)
    if name == "group":
        return parser.OFPActionGroup(arg)
    if name == "set_eth_dst":
        return parser.OFPActionSetField(eth_dst=arg)
    raise ValueError(f"cannot install action {action!r}")


def instructions(dp: Any, actions: tuple[Action, ...]) -> list[Any]:
    """A meter instruction (if any), one apply-actions instruction, a goto-table (if any);
    none at all for a drop rule."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    out = [parser.OFPInstructionMeter(a[1], ofp.OFPIT_METER) for a in actions if a[0] == "meter"]
    applied = [_action(dp, a) for a in actions if a[0] not in ("meter", "goto_table")]
    if applied:
        out.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, applied))
    out += [parser.OFPInstructionGotoTable(a[1]) for a in actions if a[0] == "goto_table"]
    return out


def flow_mod(dp: Any, spec: RuleSpec, command: str = "add") -> Any:
    """The OFPFlowMod that adds, modifies (strict) or deletes (strict) `spec`.

    Modify and delete carry the full cookie mask, so they only touch the entry
    if it still has the cookie we read: never someone else's rule by accident.
    """
    if command not in _COMMANDS:
        raise ValueError(f"command must be one of {sorted(_COMMANDS)}, not {command!r}")
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPFlowMod(
        datapath=dp,
        cookie=spec.cookie,
        cookie_mask=0 if command == "add" else ALL_MASK,
        table_id=spec.table_id,
        command=getattr(ofp, _COMMANDS[command]),
        priority=spec.priority,
        out_port=ofp.OFPP_ANY,
        out_group=ofp.OFPG_ANY,
        match=parser.OFPMatch(**spec.match_dict()),
        instructions=[] if command == "delete" else instructions(dp, spec.actions),
    )


def _action_from(action: Any) -> Action:
    if action.type == OFPAT_OUTPUT:
        return ("output", action.port)
    if action.type == OFPAT_GROUP:
        return ("group", action.group_id)
    if action.type == OFPAT_SET_FIELD and action.key == "eth_dst":
        return ("set_eth_dst", action.value)
    return ("unknown", str(action))  # differs from anything we want: reconcile replaces it


def spec_from_stats(stat: Any) -> RuleSpec | None:
    """The RuleSpec of one OFPFlowStats entry; None if its match is outside our vocabulary.

    Such entries cannot be ours (we never install them) and cannot collide with a
    rule we want, so reconciliation may ignore them. Any instruction other than
    apply-actions, meter and goto-table reads back as an "unknown" action, so a Typhoon
    rule that was tampered with is replaced rather than trusted.
    """
    fields = dict(stat.match.items())
    if not set(fields) <= set(MATCH_FIELDS):
        return None
    actions: list[Action] = []
    for inst in stat.instructions:
        if inst.type == OFPIT_APPLY_ACTIONS:
            actions.extend(_action_from(a) for a in inst.actions)
        elif inst.type == OFPIT_METER:
            actions.append(("meter", inst.meter_id))
        elif inst.type == OFPIT_GOTO_TABLE:
            actions.append(("goto_table", inst.table_id))
        else:
            actions.append(("unknown", str(inst)))
    return RuleSpec(
        priority=stat.priority,
        match=tuple(fields.items()),
        actions=tuple(actions),
        cookie=stat.cookie,
        table_id=stat.table_id,
    )


def delete_app(dp: Any, app_id: int) -> Any:
    """One flow mod removing every rule of application `app_id` from every table."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    cookie, mask = app_mask(app_id)
    return parser.OFPFlowMod(
        datapath=dp,
        cookie=cookie,
        cookie_mask=mask,
        table_id=ofp.OFPTT_ALL,
        command=ofp.OFPFC_DELETE,
        out_port=ofp.OFPP_ANY,
        out_group=ofp.OFPG_ANY,
        match=parser.OFPMatch(),
        instructions=[],
    )


def flow_stats_request(dp: Any) -> Any:
    """Ask for every entry of every table, ours or not (reconcile needs to see collisions)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPFlowStatsRequest(
        dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch()
    )


def packet_out(dp: Any, port: int, data: bytes) -> Any:
    """Send one frame (a control tuple) straight out of `port`; needs no flow rule."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPPacketOut(
        datapath=dp,
        buffer_id=ofp.OFP_NO_BUFFER,
        in_port=ofp.OFPP_CONTROLLER,
        actions=[parser.OFPActionOutput(port, 0)],
        data=data,
    )


# ----- groups ------------------------------------------------------------------------------


def group_mod(dp: Any, spec: GroupSpec, command: str = "add") -> Any:
    """The OFPGroupMod that adds, modifies or deletes ``spec`` (buckets with weights)."""
    if command not in _GROUP_COMMANDS:
        raise ValueError(f"command must be one of {sorted(_GROUP_COMMANDS)}, not {command!r}")
    ofp, parser = dp.ofproto, dp.ofproto_parser
    buckets = []
    if command != "delete":
        buckets = [
            parser.OFPBucket(
                weight=b.weight,
                watch_port=ofp.OFPP_ANY,
                watch_group=ofp.OFPG_ANY,
                actions=[_action(dp, a) for a in b.actions],
            )
            for b in spec.buckets
        ]
    return parser.OFPGroupMod(
        dp,
        command=getattr(ofp, _GROUP_COMMANDS[command]),
        type_=GROUP_TYPES[spec.type],
        group_id=spec.group_id,
        buckets=buckets,
    )


def spec_from_group_desc(desc: Any) -> GroupSpec:
    """The GroupSpec of one OFPGroupDescStats entry (reconciliation compares them)."""
    kinds = {v: k for k, v in GROUP_TYPES.items()}
    return GroupSpec(
        group_id=desc.group_id,
        buckets=tuple(
            Bucket(b.weight, tuple(_action_from(a) for a in b.actions)) for b in desc.buckets
        ),
        type=kinds.get(desc.type, f"type{desc.type}"),
    )


def group_desc_request(dp: Any) -> Any:
    """Ask for every group of the switch, ours or not."""
    return dp.ofproto_parser.OFPGroupDescStatsRequest(dp, 0)


def group_stats_request(dp: Any, group_id: int | None = None) -> Any:
    """Packet counters of one group (default: all) and of each of its buckets."""
    ofp = dp.ofproto
    return dp.ofproto_parser.OFPGroupStatsRequest(
        dp, 0, ofp.OFPG_ALL if group_id is None else group_id
    )


def port_stats_request(dp: Any) -> Any:
    """Counters of every port (frames and drops each way)."""
    return dp.ofproto_parser.OFPPortStatsRequest(dp, 0, dp.ofproto.OFPP_ANY)


# ----- meters ------------------------------------------------------------------------------

_METER_COMMANDS = {"add": "OFPMC_ADD", "modify": "OFPMC_MODIFY", "delete": "OFPMC_DELETE"}


def meter_mod(dp: Any, spec: MeterSpec, command: str = "add") -> Any:
    """The OFPMeterMod that adds, modifies or deletes ``spec``: packets/s, one drop band
    with a burst, counters on (the debugger reads how many copies the switch left out)."""
    if command not in _METER_COMMANDS:
        raise ValueError(f"command must be one of {sorted(_METER_COMMANDS)}, not {command!r}")
    ofp, parser = dp.ofproto, dp.ofproto_parser
    bands = []
    if command != "delete":
        bands = [parser.OFPMeterBandDrop(rate=spec.rate, burst_size=spec.burst)]
    return parser.OFPMeterMod(
        dp,
        command=getattr(ofp, _METER_COMMANDS[command]),
        flags=ofp.OFPMF_PKTPS | ofp.OFPMF_BURST | ofp.OFPMF_STATS,
        meter_id=spec.meter_id,
        bands=bands,
    )


def spec_from_meter_config(config: Any) -> MeterSpec | None:
    """The MeterSpec of one OFPMeterConfigStats entry; None if it is not a single-band
    meter of ours (such a meter reads back different from any we want: reconcile rewrites it)."""
    bands = list(config.bands)
    if len(bands) != 1:
        return None
    try:
        return MeterSpec(config.meter_id, bands[0].rate, bands[0].burst_size)
    except (AttributeError, ValueError):
        return None


def meter_config_request(dp: Any) -> Any:
    """Ask for every meter of the switch, ours or not."""
    return dp.ofproto_parser.OFPMeterConfigStatsRequest(dp, 0, dp.ofproto.OFPM_ALL)


def meter_stats_request(dp: Any, meter_id: int | None = None) -> Any:
    """Counters of one meter (default: all): frames in, frames each band dropped."""
    ofp = dp.ofproto
    return dp.ofproto_parser.OFPMeterStatsRequest(
        dp, 0, ofp.OFPM_ALL if meter_id is None else meter_id
    )
