"""RuleSpec <-> OpenFlow 1.3 with Ryu's real parser: what we install reads back equal.

The "switch" here is Ryu's own wire code: a flow mod's match and instructions
are serialized to bytes, wrapped in an ofp_flow_stats entry and parsed back the
way a flow stats reply is, then turned into a RuleSpec again.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from controller import ofp
from controller.framework.ryu_compat import ofproto_v1_3, ofproto_v1_3_parser
from controller.rules.cookies import RuleKind, app_mask, make_cookie
from controller.rules.flows import (
    OFPP_CONTROLLER,
    RuleSpec,
    compile_default_rules,
    compile_rules,
    goto_table,
    match,
    meter,
    output,
)
from controller.rules.meters import meter_id, sampling_meter
from controller.rules.reconcile import Plan, diff
from typhoon.topology.loader import load_topology
from typhoon.topology.scheduler import schedule

FIXTURES = Path(__file__).parent / "fixtures" / "topologies" / "good"


class FakeDatapath:
    """Just what message construction and serialization need from a datapath."""

    ofproto = ofproto_v1_3
    ofproto_parser = ofproto_v1_3_parser
    id = 0x1

    def __init__(self) -> None:
        self.xid = 0

    def set_xid(self, msg) -> int:
        self.xid += 1
        msg.set_xid(self.xid)
        return self.xid


@pytest.fixture
def dp() -> FakeDatapath:
    return FakeDatapath()


def wire(dp, msg) -> bytes:
    """Serialize like Datapath.send_msg would; proves the message is encodable."""
    dp.set_xid(msg)
    msg.serialize()
    return bytes(msg.buf)


def switch_reports(mod, packet_count: int = 0):
    """The ofp_flow_stats entry a switch would report for the entry `mod` created."""
    body = bytearray()
    mod.match.serialize(body, 0)
    for inst in mod.instructions:
        inst.serialize(body, len(body))
    head = bytearray(ofproto_v1_3.OFP_FLOW_STATS_0_SIZE)
    struct.pack_into(
        ofproto_v1_3.OFP_FLOW_STATS_0_PACK_STR,
        head,
        0,
        len(head) + len(body),
        mod.table_id,
        1,  # duration
        0,
        mod.priority,
        mod.idle_timeout,
        mod.hard_timeout,
        mod.flags,
        mod.cookie,
        packet_count,
        0,
    )
    return ofproto_v1_3_parser.OFPFlowStats.parser(bytes(head + body), 0)


def wordcount_rules() -> list[RuleSpec]:
    from fakeflows import line_cluster

    topology = load_topology(FIXTURES / "wordcount.yaml")
    physical = schedule(topology, ["h1", "h2", "h3"], 7, 100)
    rules = compile_rules(topology, physical, line_cluster(3))
    return sorted(set().union(*rules.values()) | compile_default_rules(), key=repr)


EXTRA = [
    RuleSpec(
        100,
        match(in_port=3, eth_dst=("02:00:07:02:01:00", "ff:ff:ff:ff:ff:00")),
        (("set_eth_dst", "02:00:07:00:00:05"), output(4)),
        make_cookie(7, RuleKind.LB_GROUP, 0, 1),
        table_id=1,
    ),
    RuleSpec(90, match(eth_type=0x88B5), (("group", 12),), make_cookie(7, RuleKind.LB_GROUP)),
    # written sloppily: unmasked bits, upper case, a full mask; canonical on construction
    RuleSpec(
        80,
        match(
            eth_dst=("02:00:07:02:01:FF", "ff:ff:ff:ff:ff:00"),
            eth_src=("02:00:07:00:00:0A", "FF:FF:FF:FF:FF:FF"),
        ),
        (("set_eth_dst", "02:00:07:00:00:0B"),),
        make_cookie(7, RuleKind.MIRROR),
    ),
    # a mirrored rule and its metered copy (controller/rules/mirror.py)
    RuleSpec(100, match(in_port=3), (output(4), goto_table(1)), make_cookie(7, RuleKind.MIRROR)),
    RuleSpec(
        100,
        match(in_port=3),
        (meter(meter_id(65000)), output(65000), goto_table(2)),
        make_cookie(7, RuleKind.MIRROR),
        table_id=1,
    ),
]


@pytest.mark.parametrize("spec", wordcount_rules() + EXTRA, ids=repr)
def test_installed_spec_reads_back_equal(dp, spec):
    mod = ofp.flow_mod(dp, spec, "add")
    assert wire(dp, mod)
    back = ofp.spec_from_stats(switch_reports(mod, packet_count=42))
    assert back == spec
    assert diff(frozenset({spec}), [back]) == Plan()


def test_commands_and_masks(dp):
    spec = RuleSpec(100, match(in_port=1), (output(2),), make_cookie(7, RuleKind.LOCAL, 1, 2))
    o = dp.ofproto
    add, mod, delete = (ofp.flow_mod(dp, spec, c) for c in ("add", "modify", "delete"))
    assert (add.command, mod.command, delete.command) == (
        o.OFPFC_ADD,
        o.OFPFC_MODIFY_STRICT,
        o.OFPFC_DELETE_STRICT,
    )
    for m in (add, mod, delete):
        assert (m.out_port, m.out_group, m.cookie) == (o.OFPP_ANY, o.OFPG_ANY, spec.cookie)
        assert (m.priority, m.table_id) == (100, 0)
        assert wire(dp, m)
    assert add.cookie_mask == 0
    assert mod.cookie_mask == delete.cookie_mask == (1 << 64) - 1
    assert delete.instructions == []
    with pytest.raises(ValueError):
        ofp.flow_mod(dp, spec, "replace")


def test_controller_output_is_unbuffered_and_drop_has_no_instructions(dp):
    to_ctl = RuleSpec(200, match(in_port=1), (output(OFPP_CONTROLLER),), 1)
    [inst] = ofp.flow_mod(dp, to_ctl).instructions
    assert inst.type == dp.ofproto.OFPIT_APPLY_ACTIONS
    [action] = inst.actions
    assert action.port == dp.ofproto.OFPP_CONTROLLER
    assert action.max_len == dp.ofproto.OFPCML_NO_BUFFER
    [drop] = compile_default_rules()
    assert ofp.flow_mod(dp, drop).instructions == []


def test_wire_constants_are_openflow_13():
    o = ofproto_v1_3
    assert OFPP_CONTROLLER == o.OFPP_CONTROLLER
    assert ofp.OFPIT_APPLY_ACTIONS == o.OFPIT_APPLY_ACTIONS
    assert (ofp.OFPIT_METER, ofp.OFPIT_GOTO_TABLE) == (o.OFPIT_METER, o.OFPIT_GOTO_TABLE)
    assert (ofp.OFPAT_OUTPUT, ofp.OFPAT_GROUP, ofp.OFPAT_SET_FIELD) == (
        o.OFPAT_OUTPUT,
        o.OFPAT_GROUP,
        o.OFPAT_SET_FIELD,
    )


def test_delete_app_selects_the_app_by_cookie(dp):
    m = ofp.delete_app(dp, 7)
    assert (m.command, m.table_id) == (dp.ofproto.OFPFC_DELETE, dp.ofproto.OFPTT_ALL)
    assert (m.cookie, m.cookie_mask) == app_mask(7)
    assert (m.out_port, m.out_group) == (dp.ofproto.OFPP_ANY, dp.ofproto.OFPG_ANY)
    assert len(m.match.items()) == 0
    assert wire(dp, m)


def test_foreign_entries_outside_our_vocabulary_read_as_none(dp):
    parser = dp.ofproto_parser
    mod = parser.OFPFlowMod(
        dp, cookie=5, priority=10, match=parser.OFPMatch(eth_type=0x0800, ipv4_dst="10.0.0.1")
    )
    assert ofp.spec_from_stats(switch_reports(mod)) is None


def test_unknown_actions_and_instructions_never_compare_equal(dp):
    parser, o = dp.ofproto_parser, dp.ofproto
    spec = RuleSpec(100, match(in_port=1), (output(2),), make_cookie(7, RuleKind.LOCAL, 1, 2))
    tampered = ofp.flow_mod(dp, spec)
    tampered.instructions = [
        parser.OFPInstructionActions(
            o.OFPIT_APPLY_ACTIONS, [parser.OFPActionPushVlan(), parser.OFPActionOutput(2)]
        ),
        parser.OFPInstructionWriteMetadata(1, 1),
    ]
    back = ofp.spec_from_stats(switch_reports(tampered))
    assert [a[0] for a in back.actions] == ["unknown", "output", "unknown"]
    assert diff(frozenset({spec}), [back]) == Plan(modify=(spec,))
    with pytest.raises(ValueError):
        ofp.flow_mod(dp, back)  # read-back oddities are never installed


def test_meter_mods_serialize_and_read_back_equal(dp):
    spec = sampling_meter(65000, 300)
    o, parser = dp.ofproto, dp.ofproto_parser
    add, mod, delete = (ofp.meter_mod(dp, spec, c) for c in ("add", "modify", "delete"))
    assert (add.command, mod.command, delete.command) == (
        o.OFPMC_ADD,
        o.OFPMC_MODIFY,
        o.OFPMC_DELETE,
    )
    assert add.flags == o.OFPMF_PKTPS | o.OFPMF_BURST | o.OFPMF_STATS
    assert delete.bands == [] and add.meter_id == meter_id(65000)
    for m in (add, mod, delete):
        assert wire(dp, m)
    # what a meter config reply carries, parsed by Ryu as a reply is
    body = bytearray()
    for band in add.bands:
        band.serialize(body, len(body))
    head = bytearray(o.OFP_METER_CONFIG_SIZE)
    struct.pack_into(
        o.OFP_METER_CONFIG_PACK_STR, head, 0, len(head) + len(body), add.flags, add.meter_id
    )
    config = parser.OFPMeterConfigStats.parser(bytes(head + body), 0)
    assert ofp.spec_from_meter_config(config) == spec
    with pytest.raises(ValueError):
        ofp.meter_mod(dp, spec, "replace")
    assert wire(dp, ofp.meter_config_request(dp)) and wire(dp, ofp.meter_stats_request(dp))


def test_stats_request_and_packet_out_serialize(dp):
    req = ofp.flow_stats_request(dp)
    assert (req.table_id, req.out_port, req.cookie_mask) == (
        dp.ofproto.OFPTT_ALL,
        dp.ofproto.OFPP_ANY,
        0,
    )
    assert wire(dp, req)
    out = ofp.packet_out(dp, 101, b"\x02" * 60)
    assert out.in_port == dp.ofproto.OFPP_CONTROLLER
    assert [a.port for a in out.actions] == [101]
    assert wire(dp, out)
