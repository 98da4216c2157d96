"""What every connected switch holds, and the OpenFlow messages that make it hold the desired.

Faucet style: :class:`SwitchSync` never sends; its methods take what a switch
said (features, flow stats, group descs, barrier replies, disconnects) and
return the messages to send, which the core (``controller/core.py``) writes.
Installed rules and groups are read back from the switch on connect, so a
restarted controller or a reconnecting switch converges through the same
``reconcile`` without touching rules that are already right.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from controller import ofp
from controller.rules.composer import DEFAULT_RULES
from controller.rules.flows import RuleSpec
from controller.rules.groups import GroupSpec, diff_groups
from controller.rules.meters import MeterSpec, diff_meters
from controller.rules.reconcile import diff

OFPT_MULTIPART_REQUEST = 18  # OpenFlow 1.3 message type
OFPMP_METER_CONFIG = 10  # OpenFlow 1.3 multipart type


def is_meter_config_request(data: bytes) -> bool:
    """Whether the start of an OpenFlow 1.3 message is a meter config request."""
    return (
        len(data) >= 10
        and data[1] == OFPT_MULTIPART_REQUEST
        and int.from_bytes(data[8:10], "big") == OFPMP_METER_CONFIG
    )


@dataclass
class SwitchSync:
    """Per datapath id: the switch, what it holds, what is being read, the barrier awaited."""

    logger: logging.Logger = field(default_factory=lambda: logging.getLogger(__name__))
    datapaths: dict[int, Any] = field(default_factory=dict)
    installed: dict[int, set[RuleSpec]] = field(default_factory=dict)
    installed_groups: dict[int, set[GroupSpec]] = field(default_factory=dict)
    installed_meters: dict[int, set[MeterSpec]] = field(default_factory=dict)
    port_up: dict[tuple[int, int], bool] = field(default_factory=dict)
    barriers: dict[int, int] = field(default_factory=dict)  # dpid -> xid awaited
    _stats: dict[int, list[RuleSpec]] = field(default_factory=dict)  # flow stats being read
    _group_descs: dict[int, list[GroupSpec]] = field(default_factory=dict)
    _meter_configs: dict[int, list[MeterSpec]] = field(default_factory=dict)

    def connected(self, dp: Any) -> list[Any]:
        """A switch (re)connected: forget what it held and read its groups and rules."""
        self.datapaths[dp.id] = dp
        self.installed.pop(dp.id, None)
        self._stats[dp.id] = []
        # groups are read back too: a restarted controller reconciles them like rules
        self.installed_groups.pop(dp.id, None)
        self._group_descs[dp.id] = []
        self.installed_meters.pop(dp.id, None)  # and meters (the live debugger's sampling)
        self._meter_configs[dp.id] = []
        parser = dp.ofproto_parser
        flows = parser.OFPFlowStatsRequest(
            dp,
            0,
            dp.ofproto.OFPTT_ALL,
            dp.ofproto.OFPP_ANY,
            dp.ofproto.OFPG_ANY,
            0,
            0,
            parser.OFPMatch(),
        )
        return [ofp.group_desc_request(dp), ofp.meter_config_request(dp), flows]

    def disconnected(self, dp: Any) -> bool:
        """The switch's connection died; False if ``dp`` is not the one we knew."""
        if dp.id is None or self.datapaths.get(dp.id) is not dp:
            return False
        del self.datapaths[dp.id]
        self.installed.pop(dp.id, None)
        self.installed_groups.pop(dp.id, None)
        self.installed_meters.pop(dp.id, None)
        self.barriers.pop(dp.id, None)
        return True

    def flow_stats(self, dp: Any, body: list[Any], more: bool) -> bool:
        """Part of a flow stats reply; True once the last part came (reconcile then)."""
        rules = self._stats.setdefault(dp.id, [])
        for stat in body:
            spec = ofp.spec_from_stats(stat)
            if spec is not None:
                rules.append(spec)
        if more:
            return False
        self.installed[dp.id] = set(self._stats.pop(dp.id))
        return True

    def group_descs(self, dp: Any, body: list[Any], more: bool) -> bool:
        """Part of a group desc reply; True once the last part came (reconcile then)."""
        groups = self._group_descs.setdefault(dp.id, [])
        groups.extend(ofp.spec_from_group_desc(d) for d in body)
        if more:
            return False
        self.installed_groups[dp.id] = set(self._group_descs.pop(dp.id))
        return True

    def meter_configs(self, dp: Any, body: list[Any], more: bool) -> bool:
        """Part of a meter config reply; True once the last part came (reconcile then)."""
        meters = self._meter_configs.setdefault(dp.id, [])
        meters.extend(m for c in body if (m := ofp.spec_from_meter_config(c)) is not None)
        if more:
            return False
        self.installed_meters[dp.id] = set(self._meter_configs.pop(dp.id))
        return True

    def request_failed(self, dp: Any, data: bytes) -> bool:
        """An OpenFlow error answered a request; True if it was the meter read (reconcile then).

        ``data`` holds the start of the failed request.  A switch without meters refuses
        the meter config request: it holds no meters, and waiting for a reply that never
        comes would keep its rules from ever being reconciled.
        """
        if not is_meter_config_request(data) or dp.id not in self._meter_configs:
            return False
        self._meter_configs.pop(dp.id)
        self.installed_meters[dp.id] = set()
        self.logger.warning(
            "switch %016x refused the meter read: it holds no meters (live-debugger "
            "sessions on it cannot be sampled)",
            dp.id,
        )
        return True

    def barrier_reply(self, dpid: int, xid: int) -> None:
        if self.barriers.get(dpid) == xid:
            del self.barriers[dpid]

    def port_changed(self, dpid: int, port: int, up: bool) -> bool:
        """Record a port's state; False if it was already so (a repeated status)."""
        key = (dpid, port)
        if self.port_up.get(key) == up:
            return False
        self.port_up[key] = up
        return True

    def reconcile(
        self,
        dp: Any,
        host: str | None,
        desired: frozenset[RuleSpec] = DEFAULT_RULES,
        desired_groups: frozenset[GroupSpec] = frozenset(),
        desired_meters: frozenset[MeterSpec] = frozenset(),
    ) -> list[Any]:
        """The messages that make one switch hold exactly ``desired`` (and our groups
        ``desired_groups`` and meters ``desired_meters``), then a barrier; none if it
        already does or was not read yet."""
        installed = self.installed.get(dp.id)
        installed_groups = self.installed_groups.get(dp.id)
        installed_meters = self.installed_meters.get(dp.id)
        if installed is None or installed_groups is None or installed_meters is None:
            return []  # flow stats, group descs or meters not read yet: a reply will reconcile
        plan = diff(desired, installed)
        groups = diff_groups(desired_groups, installed_groups)
        meters = diff_meters(desired_meters, installed_meters)
        if not (plan.add or plan.modify or plan.delete or groups or meters):
            return []
        # a rule may only point at a group or meter that exists; deleting either deletes
        # the rules that use it
        msgs = [ofp.meter_mod(dp, m, "add") for m in meters.add]
        msgs += [ofp.meter_mod(dp, m, "modify") for m in meters.modify]
        msgs += [ofp.group_mod(dp, g, "add") for g in groups.add]
        msgs += [ofp.group_mod(dp, g, "modify") for g in groups.modify]
        msgs += [ofp.flow_mod(dp, spec, "delete") for spec in plan.delete]
        msgs += [ofp.flow_mod(dp, spec, "modify") for spec in plan.modify]
        msgs += [ofp.flow_mod(dp, spec, "add") for spec in plan.add]
        msgs += [ofp.group_mod(dp, g, "delete") for g in groups.delete]
        msgs += [ofp.meter_mod(dp, m, "delete") for m in meters.delete]
        self.installed[dp.id] = set(desired)
        wanted_meters = {m.meter_id for m in desired_meters}
        self.installed_meters[dp.id] = set(desired_meters) | {
            m for m in installed_meters if m.meter_id not in wanted_meters
        } - set(meters.delete)
        wanted = {g.group_id for g in desired_groups}
        others = {g for g in installed_groups if g.group_id not in wanted}
        self.installed_groups[dp.id] = set(desired_groups) | (others - set(groups.delete))
        barrier = dp.ofproto_parser.OFPBarrierRequest(dp)
        dp.set_xid(barrier)
        self.barriers[dp.id] = barrier.xid
        msgs.append(barrier)
        self.logger.info(
            "switch %s: +%d ~%d -%d rules", host, len(plan.add), len(plan.modify), len(plan.delete)
        )
        if meters:
            self.logger.info(
                "switch %s: +%d ~%d -%d meters",
                host, len(meters.add), len(meters.modify), len(meters.delete),
            )  # fmt: skip
        if groups:
            self.logger.info(
                "switch %s: +%d ~%d -%d groups",
                host, len(groups.add), len(groups.modify), len(groups.delete),
            )  # fmt: skip
        return msgs

    def synced(self) -> bool:
        """Every connected switch holds the desired rules (barriers answered)."""
        return not self.barriers and all(d in self.installed for d in self.datapaths)
