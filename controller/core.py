"""TyphoonController: the core Ryu app (OpenFlow 1.3 only), a shim over pure logic.

It keeps no state that it cannot rebuild: desired rules come from the
coordinator (``view.py`` + ``flows.py``), installed rules from the switch
(flow stats on connect), and ``reconcile.diff`` says what to add, change or
delete, so a restarted controller or a reconnecting switch converges without
touching rules that are already right.  Control tuples go to workers by
PacketOut; METRIC_RESP comes back by PacketIn and is raised as a Ryu event,
with port status changes, for the apps in ``apps/``.

Services for other apps (get the instance with ``core_app()``):
``send_control``, ``request_metrics``, ``set_extra_rules`` / ``clear_extra_rules``
(apps contribute rule specs, the core installs them), ``set_rule_overlay`` /
``clear_rule_overlay`` (apps rewrite the final rules, e.g. mirrors),
``set_group_provider`` / ``clear_group_provider`` (apps contribute OpenFlow groups
and the rules that use them, recomputed with the topology), ``view``,
``reconcile_all``, ``reconfigure`` (start a stable update, ``controller/reconfigure.py``;
the executor waits on ``acked`` and ``rules_ready`` and keeps the old rules with
``set_kept_rules`` while it runs).
"""

from __future__ import annotations

import collections
import itertools
import json
import time
from collections.abc import Callable, Iterable

from controller import ofp
from controller.events import (
    EventSparkMetrics,
    EventTopologyChanged,
    EventWorkerAck,
    EventWorkerDown,
    EventWorkerMetrics,
    EventWorkerUp,
)
from controller.flows import RuleSpec, compile_default_rules
from controller.groups import GroupSpec, diff_groups
from controller.metrics import SparkTotals
from controller.metrics import registry as metrics_registry
from controller.options import read_settings, register_settings
from controller.reconcile import diff
from controller.reconfigure import Executor, Reconfiguration, Registry
from controller.rest import TyphoonRest
from controller.ryu_compat import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    Datapath,
    RyuApp,
    WSGIApplication,
    hub,
    lookup_service_brick,
    ofp_event,
    ofproto_v1_3,
    set_ev_cls,
)
from controller.settings import CoreSettings
from controller.view import ClusterView
from typhoon import wire
from typhoon.checkpoint.progress import JobProgress, guaranteed
from typhoon.coordinator import open_coordinator
from typhoon.manager import Manager
from typhoon.reconfig import Request
from typhoon.topology.budgets import plan_budgets
from typhoon.wire import Control, ControlTuple, Kind, WireError

register_settings(CoreSettings)

APP_NAME = "TyphoonController"
DEFAULT_RULES = frozenset(compile_default_rules())

# (host, its complete rule set) -> the rule set to install instead
Overlay = Callable[[str, frozenset[RuleSpec]], frozenset[RuleSpec]]
# view -> (host -> groups, host -> rules that point at them)
GroupProvider = Callable[
    [ClusterView], tuple[dict[str, frozenset[GroupSpec]], dict[str, frozenset[RuleSpec]]]
]


def core_app() -> TyphoonController:
    """The running core app, for apps that call its services."""
    app = lookup_service_brick(APP_NAME)
    if app is None:
        raise RuntimeError("the Typhoon controller core is not loaded")
    return app


class TyphoonController(RyuApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"wsgi": WSGIApplication}
    _EVENTS = [
        EventWorkerUp,
        EventWorkerDown,
        EventWorkerMetrics,
        EventWorkerAck,
        EventSparkMetrics,
        EventTopologyChanged,
    ]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.name = APP_NAME
        self.settings = read_settings(CoreSettings)
        self.coordinator = open_coordinator(self.settings.coordinator or None)
        self.version = -1
        self.view = ClusterView.read(self.coordinator)
        self.desired_rules: dict[str, frozenset[RuleSpec]] = {}
        self.datapaths: dict[int, Datapath] = {}
        self.installed: dict[int, set[RuleSpec]] = {}  # dpid -> rules on the switch
        self._stats: dict[int, list[RuleSpec]] = {}  # flow stats being received
        self.barriers: dict[int, int] = {}  # dpid -> xid of the barrier we wait for
        self.extra: dict[str, dict[str, frozenset[RuleSpec]]] = {}  # owner -> host -> rules
        self.overlays: dict[str, Overlay] = {}  # owner -> rewrite of a host's final rules
        self.group_providers: dict[str, GroupProvider] = {}  # owner -> groups from the view
        self.desired_groups: dict[str, frozenset[GroupSpec]] = {}  # host -> groups
        self.installed_groups: dict[int, set[GroupSpec]] = {}  # dpid -> groups on the switch
        self._group_descs: dict[int, list[GroupSpec]] = {}  # group descs being received
        self.port_up: dict[tuple[int, int], bool] = {}
        self.ctrl_seq: dict[tuple[int, int], int] = {}
        self.reassembly: dict[bytes, wire.Reassembler] = {}
        self.request_ids = itertools.count(1)
        self.physical_versions: dict[str, int] = {}
        self.drops: dict[str, int] = {}
        self.acks: collections.deque[dict] = collections.deque(maxlen=1000)
        # (app, ack, version) -> workers that confirmed it, for the reconfiguration executor
        self.ack_log: collections.OrderedDict[tuple[str, str, int], set[int]] = (
            collections.OrderedDict()
        )
        self.kept: dict[str, dict[str, frozenset[RuleSpec]]] = {}  # owner -> host -> rules
        self.reconciling = False
        # versions of control tuples the executor waits for; a restart never reuses one
        self.control_versions = itertools.count(int(time.time() * 1000))
        self.reconfigs = Registry()  # the latest reconfiguration of every application
        self.manager = Manager(self.coordinator)
        self.rates: dict[str, dict[int, dict]] = {}  # app -> worker -> tuples/s in and out
        self.told_budgets: dict[tuple[str, int], int] = {}  # (app, worker) -> FLOW_CONTROL sent
        self._last_counts: dict[tuple[str, int], tuple[float, int, int]] = {}
        # request id -> worker -> metrics, for callers waiting for their own METRIC_REQ
        self.responses: collections.OrderedDict[int, dict[int, dict]] = collections.OrderedDict()
        self.progress: dict[str, JobProgress] = {}  # guaranteed apps: checkpoints, the end
        # GET /metrics: each worker's last METRIC_RESP, Spark progress summed per node
        self.worker_metrics: dict[str, dict[int, dict]] = {}  # app -> worker -> metrics
        self.spark_totals = SparkTotals()
        self.metrics_registry = metrics_registry(self, lookup_service_brick)
        self.refresh_desired()
        kwargs["wsgi"].register(TyphoonRest, {"core": self, "token": self.settings.api_token})
        self.threads.append(hub.spawn(self._watch_loop))
        self.threads.append(hub.spawn(self._metrics_loop))

    # ----- switches ------------------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev):
        dp = ev.msg.datapath
        self.datapaths[dp.id] = dp
        self.installed.pop(dp.id, None)
        self._stats[dp.id] = []
        # groups are read back too: a restarted controller reconciles them like rules
        self.installed_groups.pop(dp.id, None)
        self._group_descs[dp.id] = []
        dp.send_msg(ofp.group_desc_request(dp))
        self.logger.info(
            "switch connected: dpid=%016x host=%s", dp.id, self.view.host_of_dpid(dp.id)
        )
        parser = dp.ofproto_parser
        dp.send_msg(
            parser.OFPFlowStatsRequest(
                dp,
                0,
                dp.ofproto.OFPTT_ALL,
                dp.ofproto.OFPP_ANY,
                dp.ofproto.OFPG_ANY,
                0,
                0,
                parser.OFPMatch(),
            )
        )

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats(self, ev):
        dp = ev.msg.datapath
        rules = self._stats.setdefault(dp.id, [])
        for stat in ev.msg.body:
            spec = ofp.spec_from_stats(stat)
            if spec is not None:
                rules.append(spec)
        if ev.msg.flags & dp.ofproto.OFPMPF_REPLY_MORE:
            return
        self.installed[dp.id] = set(self._stats.pop(dp.id))
        self.logger.info("switch %016x holds %d rules; reconciling", dp.id, len(rules))
        self.reconcile(dp)

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, MAIN_DISPATCHER)
    def _group_desc(self, ev):
        dp = ev.msg.datapath
        groups = self._group_descs.setdefault(dp.id, [])
        groups.extend(ofp.spec_from_group_desc(d) for d in ev.msg.body)
        if ev.msg.flags & dp.ofproto.OFPMPF_REPLY_MORE:
            return
        self.installed_groups[dp.id] = set(self._group_descs.pop(dp.id))
        self.reconcile(dp)

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev):
        dp = ev.datapath
        if ev.state == DEAD_DISPATCHER and dp.id is not None and self.datapaths.get(dp.id) is dp:
            del self.datapaths[dp.id]
            self.installed.pop(dp.id, None)
            self.installed_groups.pop(dp.id, None)
            self.barriers.pop(dp.id, None)
            self.logger.info("switch disconnected: dpid=%016x", dp.id)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier(self, ev):
        dp = ev.msg.datapath
        if self.barriers.get(dp.id) == ev.msg.xid:
            del self.barriers[dp.id]

    def reconcile(self, dp: Datapath) -> None:
        """Make one switch hold exactly the desired rules; touch nothing that is right."""
        installed = self.installed.get(dp.id)
        installed_groups = self.installed_groups.get(dp.id)
        if installed is None or installed_groups is None:
            return  # flow stats or group descs not read yet: their reply will reconcile
        host = self.view.host_of_dpid(dp.id)
        desired = self.desired_rules.get(host, DEFAULT_RULES)
        plan = diff(desired, installed)
        desired_groups = self.desired_groups.get(host, frozenset())
        groups = diff_groups(desired_groups, installed_groups)
        if not (plan.add or plan.modify or plan.delete or groups):
            return
        # a rule may only point at a group that exists; deleting a group deletes its rules
        for g in groups.add:
            dp.send_msg(ofp.group_mod(dp, g, "add"))
        for g in groups.modify:
            dp.send_msg(ofp.group_mod(dp, g, "modify"))
        for spec in plan.delete:
            dp.send_msg(ofp.flow_mod(dp, spec, "delete"))
        for spec in plan.modify:
            dp.send_msg(ofp.flow_mod(dp, spec, "modify"))
        for spec in plan.add:
            dp.send_msg(ofp.flow_mod(dp, spec, "add"))
        for g in groups.delete:
            dp.send_msg(ofp.group_mod(dp, g, "delete"))
        self.installed[dp.id] = set(desired)
        wanted = {g.group_id for g in desired_groups}
        others = {g for g in installed_groups if g.group_id not in wanted}
        self.installed_groups[dp.id] = set(desired_groups) | (others - set(groups.delete))
        barrier = dp.ofproto_parser.OFPBarrierRequest(dp)
        dp.set_xid(barrier)
        self.barriers[dp.id] = barrier.xid
        dp.send_msg(barrier)
        self.logger.info(
            "switch %s: +%d ~%d -%d rules", host, len(plan.add), len(plan.modify), len(plan.delete)
        )
        if groups:
            self.logger.info(
                "switch %s: +%d ~%d -%d groups",
                host, len(groups.add), len(groups.modify), len(groups.delete),
            )  # fmt: skip

    def refresh_desired(self) -> None:
        """Recompute every bridge's rule set from the view and the apps' extra rules."""
        merged: dict[str, frozenset[RuleSpec]] = {}
        groups: dict[str, frozenset[GroupSpec]] = {}
        for owner, provider in self.group_providers.items():
            try:
                by_host, rules = provider(self.view)
            except Exception:  # one app's bug must not keep the topology's rules out
                self.logger.exception("group provider of %s failed; skipped", owner)
                continue
            for host, gs in by_host.items():
                groups[host] = groups.get(host, frozenset()) | gs
            for host, rs in rules.items():
                merged[host] = merged.get(host, frozenset()) | rs
        self.desired_groups = groups
        for per_host in self.extra.values():
            for host, rules in per_host.items():
                merged[host] = merged.get(host, frozenset()) | rules
        desired = self.view.desired(merged)
        for per_host in self.kept.values():
            for host, rules in per_host.items():
                # rules kept through a reconfiguration yield to the current ones (same match)
                have = desired.get(host, DEFAULT_RULES)
                keys = {r.key for r in have}
                desired[host] = have | {r for r in rules if r.key not in keys}
        for owner, overlay in self.overlays.items():
            try:
                desired = {host: overlay(host, rules) for host, rules in desired.items()}
            except Exception:  # one app's bug must not keep the topology's rules out
                self.logger.exception("rule overlay of %s failed; skipped", owner)
        self.desired_rules = desired

    def reconcile_all(self) -> None:
        self.reconciling = True
        try:
            for dp in list(self.datapaths.values()):
                self.reconcile(dp)
        finally:
            self.reconciling = False

    def synced(self) -> bool:
        """Every connected switch holds the desired rules (barriers answered)."""
        return not self.barriers and all(d in self.installed for d in self.datapaths)

    # ----- coordinator ---------------------------------------------------------------------

    def _watch_loop(self):
        while True:
            try:
                self._poll_coordinator()
            except Exception:  # a bad record must not stop the controller
                self.logger.exception("reading the coordinator failed")
            hub.sleep(self.settings.poll_interval)

    def _poll_coordinator(self) -> None:
        version, keys = self.coordinator.changes_since(self.version)
        if version != self.version:
            self.version = version
            problems = dict(self.view.problems)
            self.view = ClusterView.read(self.coordinator)
            self.refresh_desired()
            self.reconcile_all()
            for name, why in self.view.problems.items():
                if problems.get(name) != why:
                    self.logger.error("app %s: cannot compile its rules: %s", name, why)
            self._announce_changes()
            self._push_budgets()
        self._start_or_drain()

    def _announce_changes(self) -> None:
        current = {n: a.physical.version for n, a in self.view.apps.items()}
        for name, v in current.items():
            if self.physical_versions.get(name) != v:
                self.send_event_to_observers(EventTopologyChanged(name, v))
        for name in set(self.physical_versions) - set(current):
            self.send_event_to_observers(EventTopologyChanged(name, None))
        self.physical_versions = current

    def _start_or_drain(self) -> None:
        """ACTIVATE an app's spouts once its workers are attached and rules are in."""
        for name, app in self.view.apps.items():
            state = app.state
            if not state.get("active") and app.all_attached() and self.synced():
                hosts = {w.host for w in app.physical.workers}
                connected = {self.view.host_of_dpid(d) for d in self.datapaths}
                if not hosts <= connected:
                    continue
                self.send_control(name, app.spout_workers(), ControlTuple(Control.ACTIVATE, {}))
                fresh = self.coordinator.get_app_state(name)  # others write keys too
                self.coordinator.put_app_state(
                    name, {**fresh, "active": True, "activated_at": time.time()}
                )
                self.logger.info("app %s: all workers attached, spouts activated", name)
            elif state.get("drain") and not state.get("drained"):
                self.send_control(
                    name, app.spout_workers(), ControlTuple(Control.DRAIN, {"version": 0})
                )
                fresh = self.coordinator.get_app_state(name)
                self.coordinator.put_app_state(name, {**fresh, "drained": True})
                self.logger.info("app %s: sources drained on request", name)

    def _push_budgets(self) -> None:
        """FLOW_CONTROL to every attached worker whose share of the switch's socket
        buffers (``typhoon.topology.budgets``) differs from what it was last told.

        Agents start workers with the share of the physical topology they launch
        them from; workers added or moved later change the shares of the others.
        Applications that set ``sdn.port_budget`` (or turn flow control off) keep theirs.
        """
        told = self.told_budgets
        for name, app in self.view.apps.items():
            config = app.topology.config
            if "port_budget" in (config.get("sdn") or {}) or config.get("flow_control") is False:
                continue
            try:
                budgets = plan_budgets(app.topology, app.physical, self.view.cluster).budgets
            except (ValueError, KeyError) as e:
                self.logger.error("app %s: no budgets: %s", name, e)
                continue
            for wid, budget in budgets.items():
                status = app.statuses.get(wid)
                if status is None or status.state not in ("attached", "running"):
                    continue
                if told.get((name, wid)) == budget:
                    continue
                ct = ControlTuple(Control.FLOW_CONTROL, {"budget": budget})
                if self.send_control(name, [wid], ct):
                    told[(name, wid)] = budget
        live = set(self.view.apps)
        for key in [k for k in told if k[0] not in live]:
            del told[key]

    # ----- control tuples ------------------------------------------------------------------

    def send_control(self, app: str, worker_ids: Iterable[int], ct: ControlTuple) -> int:
        """PacketOut one control tuple to each worker's port; returns how many were sent."""
        view = self.view.apps.get(app)
        if view is None:
            raise KeyError(f"no application named {app!r}")
        payload = wire.encode_control(ct)
        app_id = view.physical.app_id
        src = wire.controller_mac(app_id)
        sent = 0
        for wid in worker_ids:
            w = view.physical.by_id(wid)
            dp = self._dp_of_host(w.host)
            if dp is None:
                self.logger.warning("app %s: no switch for host %s (worker %d)", app, w.host, wid)
                continue
            seq = self.ctrl_seq.get((app_id, wid), 0)
            frames = wire.pack_frames(
                wire.worker_mac(app_id, wid), src, Kind.CONTROL, 0, seq, [payload]
            )
            self.ctrl_seq[(app_id, wid)] = seq + len(frames)
            parser, ofp_ = dp.ofproto_parser, dp.ofproto
            for frame in frames:
                dp.send_msg(
                    parser.OFPPacketOut(
                        datapath=dp,
                        buffer_id=ofp_.OFP_NO_BUFFER,
                        in_port=ofp_.OFPP_CONTROLLER,
                        actions=[parser.OFPActionOutput(w.port)],
                        data=frame,
                    )
                )
            sent += 1
        return sent

    def request_metrics(self, app: str, worker_ids: Iterable[int] | None = None) -> int:
        """METRIC_REQ to the given (default: every attached) worker of an app."""
        view = self.view.apps.get(app)
        if view is None:
            return 0
        if worker_ids is None:
            # a worker the physical topology left out (replaced while hung, still being
            # stopped by its agent) is attached but no longer addressable: skip it, or the
            # whole round fails and every worker misses its METRIC_REQ
            present = {w.worker_id for w in view.physical.workers}
            worker_ids = [
                wid
                for wid, s in view.statuses.items()
                if s.state in ("attached", "running") and wid in present
            ]
        rid = next(self.request_ids) & 0x7FFFFFFF
        return self.send_control(
            app, worker_ids, ControlTuple(Control.METRIC_REQ, {"request_id": rid})
        )

    def _metrics_loop(self):
        while True:
            hub.sleep(self.settings.metrics_interval)
            for name, app in list(self.view.apps.items()):
                if app.state.get("active"):
                    try:
                        self.request_metrics(name)
                    except Exception:
                        self.logger.exception("metrics request for %s failed", name)

    def _dp_of_host(self, host: str) -> Datapath | None:
        info = self.view.cluster.hosts.get(host)
        return self.datapaths.get(info.dpid) if info else None

    # ----- packet-in: worker replies -------------------------------------------------------

    def _drop(self, reason: str) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + 1

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev):
        data = bytes(ev.msg.data)
        try:
            frame = wire.decode_frame(data)
            src = wire.parse_mac(frame.src)
            dst = wire.parse_mac(frame.dst)
        except WireError:
            self._drop("malformed_frame")
            return
        if frame.kind != Kind.CONTROL or dst.cls != wire.AddrClass.CONTROLLER:
            self._drop("unexpected_frame")
            return
        app = self.view.app_by_id(src.app_id)
        if app is None or src.cls != wire.AddrClass.WORKER:
            self._drop("unknown_sender")
            return
        payloads = frame.payloads
        if frame.flags & wire.SEG:
            r = self.reassembly.setdefault(frame.src, wire.Reassembler())
            try:
                payloads = r.feed(frame)
            except WireError:
                self._drop("bad_segment")
                return
        for p in payloads:
            try:
                ct = wire.decode_control(p)
            except WireError:
                self._drop("malformed_control")
                continue
            if ct.type != Control.METRIC_RESP or ct.body["worker"] != src.value:
                self._drop("unexpected_control")
                continue
            self._worker_reply(app, src.value, ct.body["metrics"], ct.body["request_id"])

    def _worker_reply(self, app: str, worker_id: int, metrics: dict, request_id: int) -> None:
        now = time.monotonic()
        if "ack" in metrics:
            self.acks.append(
                {
                    "app": app,
                    "worker": worker_id,
                    "ack": metrics["ack"],
                    "version": metrics["version"],
                    "time": time.time(),
                }
            )
            key = (app, metrics["ack"], metrics["version"])
            self.ack_log.setdefault(key, set()).add(worker_id)
            self.ack_log.move_to_end(key)
            while len(self.ack_log) > 4096:
                self.ack_log.popitem(last=False)
            self.send_event_to_observers(
                EventWorkerAck(app, worker_id, metrics["ack"], metrics["version"], now)
            )
            return
        self._rate(app, worker_id, metrics)
        metrics = {**metrics, "request_id": request_id}
        self.responses.setdefault(request_id, {})[worker_id] = metrics
        self.worker_metrics.setdefault(app, {})[worker_id] = metrics
        while len(self.responses) > 256:
            self.responses.popitem(last=False)
        self.coordinator.put_metrics(app, worker_id, metrics)
        self._guarantee_progress(app, worker_id, metrics)
        self.send_event_to_observers(EventWorkerMetrics(app, worker_id, metrics, now))
        spark = metrics.get("spark")
        if isinstance(spark, dict):
            self._spark_progress(app, worker_id, spark, now)

    def _guarantee_progress(self, app: str, worker_id: int, metrics: dict) -> None:
        """Record each new global checkpoint; COMPLETE once every worker finished."""
        view = self.view.apps.get(app)
        if view is None or not guaranteed(view.topology):
            return
        progress = self.progress.setdefault(app, JobProgress())
        progress.heard(worker_id, metrics)
        physical = view.physical
        behind = progress.behind(worker_id, metrics, physical, time.monotonic())
        if behind is not None and view.all_attached():
            # a recovery this worker has not heard of (a ROLLBACK lost, or a controller
            # restarted in the middle of one): level-triggered, like the rules
            self.send_control(app, [worker_id], ControlTuple(Control.ROLLBACK, behind))
        epoch = progress.global_epoch(physical)
        if epoch is not None and (progress.recorded is None or epoch > progress.recorded):
            progress.recorded = epoch
            state = self.coordinator.get_app_state(app) or {}
            self.coordinator.put_app_state(
                app, {**state, "checkpoint": {"epoch": epoch, "time": time.time()}}
            )
        first = progress.completed_generation != physical.generation
        workers = progress.to_complete(worker_id, metrics, physical)
        if workers:
            if first:
                self.logger.info("app %s: every worker finished; COMPLETE", app)
            self.send_control(app, workers, ControlTuple(Control.COMPLETE, {}))

    def _spark_progress(self, app: str, worker_id: int, spark: dict, now: float) -> None:
        """Spark StreamingQueryListener progress carried in a spark node's METRIC_RESP."""
        try:
            events = json.loads(spark.get("events") or "[]")
            node = str(spark["node"])
        except (ValueError, KeyError, TypeError):
            self._drop("malformed_spark_metrics")
            return
        for progress in events if isinstance(events, list) else []:
            if isinstance(progress, dict):
                self.spark_totals.add(app, node, progress)
                self.send_event_to_observers(EventSparkMetrics(app, node, progress, now))

    # ----- port status: workers coming and going -------------------------------------------

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev):
        now = time.monotonic()
        msg = ev.msg
        dp = msg.datapath
        ofp_ = dp.ofproto
        port = msg.desc.port_no
        host = self.view.host_of_dpid(dp.id)
        if host is None:
            return
        if msg.reason == ofp_.OFPPR_DELETE:
            up, reason = False, "deleted"
        else:
            up = not (msg.desc.state & ofp_.OFPPS_LINK_DOWN)
            reason = "link_down"
        key = (dp.id, port)
        if self.port_up.get(key) == up:
            return
        self.port_up[key] = up
        if msg.reason == ofp_.OFPPR_ADD and not up:
            return  # a TAP just added to the bridge, not up yet: nothing went down
        found = self.view.worker_at(host, port)
        if found is None:
            self.view = ClusterView.read(self.coordinator)
            found = self.view.worker_at(host, port)
            if found is None:
                return
        app, w = found
        if up:
            self.send_event_to_observers(EventWorkerUp(app, w.worker_id, host, port, now))
        else:
            self.logger.info(
                "app %s: worker %d port %s/%d %s", app, w.worker_id, host, port, reason
            )
            self.send_event_to_observers(EventWorkerDown(app, w.worker_id, host, port, reason, now))

    # ----- services for apps ---------------------------------------------------------------

    def set_extra_rules(self, owner: str, rules: dict[str, frozenset[RuleSpec]]) -> None:
        """Rules an app needs besides the topology's (mirrors, LB groups); installed now."""
        self.extra[owner] = dict(rules)
        self.refresh_desired()
        self.reconcile_all()

    def clear_extra_rules(self, owner: str) -> None:
        if self.extra.pop(owner, None) is not None:
            self.refresh_desired()
            self.reconcile_all()

    def set_rule_overlay(self, owner: str, overlay: Overlay) -> None:
        """Rewrite every host's final rules with ``overlay`` from now on; installed now.

        For rules that are a function of the others (the live debugger's mirror
        outputs): the core applies it on every recompute, so the result follows
        topology changes and other apps' extra rules in the same step, never a
        stale copy of them.  Setting it again re-applies it (the owner's inputs changed).
        """
        self.overlays[owner] = overlay
        self.refresh_desired()
        self.reconcile_all()

    def clear_rule_overlay(self, owner: str) -> None:
        if self.overlays.pop(owner, None) is not None:
            self.refresh_desired()
            self.reconcile_all()

    # ----- reconfiguration (stable topology update, paper §3.5) -----------------------------

    def next_control_version(self) -> int:
        return next(self.control_versions) & 0x7FFFFFFFFFFFFFFF

    def acked(self, app: str, what: str, version: int) -> set[int]:
        """Workers that confirmed the control tuple ``what`` with ``version``."""
        return self.ack_log.get((app, what, version), set())

    def rules_ready(self, app: str, version: int) -> bool:
        """The view holds ``version`` of ``app`` and every connected switch confirmed its rules."""
        view = self.view.apps.get(app)
        if view is None or view.physical.version < version or self.reconciling:
            return False
        connected = {self.view.host_of_dpid(d) for d in self.datapaths}
        hosts = {w.host for w in view.physical.workers}
        return hosts <= connected and self.synced()

    def set_kept_rules(self, owner: str, rules: dict[str, frozenset[RuleSpec]]) -> None:
        """Rules that stay installed (unless a current rule has their match) until cleared."""
        self.kept[owner] = dict(rules)
        self.refresh_desired()
        self.reconcile_all()

    def clear_kept_rules(self, owner: str) -> None:
        if self.kept.pop(owner, None) is not None:
            self.refresh_desired()
            self.reconcile_all()

    def sleep(self, seconds: float) -> None:
        hub.sleep(seconds)

    def reconfigure(self, app: str, request: Request) -> Reconfiguration:
        """Plan ``request`` and start running it; ReconfigError (4xx) if it cannot start.

        Only one reconfiguration per application runs at a time.
        """
        # another application's running update may not have written its new ports yet
        reserved = {
            (w.host, w.port)
            for other, r in self.reconfigs.latest.items()
            if other != app and r.running
            for w in r.plan.physical.workers
        }
        record = self.reconfigs.begin(
            app, lambda: self.manager.plan(app, request, reserved=reserved)
        )
        executor = Executor(
            self, self.manager, record, self.settings.reconfig_step_timeout, self.logger
        )
        self.logger.info("app %s: reconfiguration %d: %s", app, record.id, record.plan.summary())
        hub.spawn(executor.run)
        return record

    def _rate(self, app: str, worker_id: int, metrics: dict) -> None:
        """Tuples per second in and out since the worker's previous METRIC_RESP."""
        t = metrics.get("time")
        if not isinstance(t, (int, float)):
            return
        total_in = sum(v for k, v in metrics.get("in", {}).items() if k != "0")
        total_out = sum(metrics.get("out", {}).values())
        prev = self._last_counts.get((app, worker_id))
        self._last_counts[(app, worker_id)] = (t, total_in, total_out)
        if prev is not None and t > prev[0]:
            dt = t - prev[0]
            self.rates.setdefault(app, {})[worker_id] = {
                "in": round((total_in - prev[1]) / dt, 1),
                "out": round((total_out - prev[2]) / dt, 1),
            }

    def set_group_provider(self, owner: str, provider: GroupProvider) -> None:
        """Install the groups ``provider(view)`` returns, and the rules that use them.

        The core calls it again on every recompute (topology change, any app's
        rules), so groups follow the workers in the same step as the topology's
        own rules; setting it again re-applies it (the owner's inputs changed, e.g.
        new weights).  Groups are sent before the rules that point at them.
        """
        self.group_providers[owner] = provider
        self.refresh_desired()
        self.reconcile_all()

    def clear_group_provider(self, owner: str) -> None:
        if self.group_providers.pop(owner, None) is not None:
            self.refresh_desired()
            self.reconcile_all()
