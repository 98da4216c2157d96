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

from controller.cookies import ALL_MASK, app_mask
from controller.flows import MATCH_FIELDS, OFPP_CONTROLLER, Action, RuleSpec
from controller.groups import Bucket, GroupSpec

# OpenFlow 1.3 wire numbers, so reading stats back needs no datapath (checked against Ryu's)
OFPIT_APPLY_ACTIONS = 4
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
    """One apply-actions instruction, or none at all for a drop rule."""
    if not actions:
        return []
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return [
        parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [_action(dp, a) for a in actions])
    ]


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
    apply-actions reads back as an "unknown" action, so a Typhoon rule that was
    tampered with is replaced rather than trusted.
    """
    fields = dict(stat.match.items())
    if not set(fields) <= set(MATCH_FIELDS):
        return None
    actions: list[Action] = []
    for inst in stat.instructions:
        if inst.type == OFPIT_APPLY_ACTIONS:
            actions.extend(_action_from(a) for a in inst.actions)
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
