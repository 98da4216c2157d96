"""TyphoonController: the core Ryu app (OpenFlow 1.3 only), a shim over pure logic.

It keeps no state that it cannot rebuild: desired rules come from the
coordinator (``rules/view.py`` + ``rules/flows.py``) and the apps' contributions
(``rules/composer.py``), installed rules from the switch (``switch_sync.py`` reads
them back on connect and returns the messages that reconcile them), so a
restarted controller or a reconnecting switch converges without touching
rules that are already right.  Control tuples go to workers by PacketOut and
METRIC_RESPs come back by PacketIn (``control_channel.py``); they and port
status changes are raised as Ryu events for the apps in ``apps/``.

Apps do not read this class: they call ``controller/services.py``, the narrow
API over it (the REST API, ``controller/rest.py``, and the metrics collector,
``controller/metrics.py``, still read its state).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

from controller.absent_switches import AbsentSwitches
from controller.app_support import start_timer
from controller.budgets import budget_updates
from controller.control_channel import ControlChannel, Reply
from controller.core_recovery import BuiltinRecovery
from controller.events import (
    EventSparkMetrics,
    EventTopologyChanged,
    EventWorkerAck,
    EventWorkerDown,
    EventWorkerMetrics,
    EventWorkerUp,
)
from controller.framework.ryu_compat import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    Datapath,
    RyuApp,
    WSGIApplication,
    event,
    hub,
    lookup_service_brick,
    ofp_event,
    ofproto_v1_3,
    set_ev_cls,
)
from controller.job_end import finish_jobs
from controller.metrics import SparkTotals
from controller.metrics import registry as metrics_registry
from controller.options import read_settings, register_settings
from controller.progress import WorkerProgress
from controller.reconfigure import Executor, Reconfiguration, Registry
from controller.rest import TyphoonRest, set_read_tokens
from controller.rules.composer import DEFAULT_RULES, RuleComposer, Source
from controller.rules.flows import RuleSpec
from controller.rules.groups import GroupSpec
from controller.rules.meters import MeterSpec
from controller.rules.view import ClusterView, rereads_view
from controller.services import CORE_APP
from controller.settings import CoreSettings
from controller.switch_sync import SwitchSync
from typhoon.checkpoint.progress import JobProgress
from typhoon.coordinator import open_coordinator
from typhoon.manager import Manager
from typhoon.reconfig import Request
from typhoon.wire import DEFAULT_MTU, Control, ControlTuple

register_settings(CoreSettings)


class EventPollCoordinator(event.EventBase):
    """Timer: read the coordinator's changes (every ``poll_interval``)."""


class EventMetricsRound(event.EventBase):
    """Timer: METRIC_REQ to every active application (every ``metrics_interval``)."""


class TyphoonController(WorkerProgress, BuiltinRecovery, RyuApp):
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
        self.name = CORE_APP
        self.settings = read_settings(CoreSettings)
        self.coordinator = open_coordinator(self.settings.coordinator or None)
        self.version = -1
        self.view = ClusterView.read(self.coordinator)
        self.composer = RuleComposer(self.logger)
        self.sync = SwitchSync(self.logger)
        self.channel = ControlChannel()
        self.absent = AbsentSwitches()  # hosts without a switch yet: said once each
        self.desired_rules: dict[str, frozenset[RuleSpec]] = {}
        self.desired_groups: dict[str, frozenset[GroupSpec]] = {}  # host -> groups
        self.desired_meters: dict[str, frozenset[MeterSpec]] = {}  # host -> meters
        self.physical_versions: dict[str, int] = {}
        self.reconciling = False
        # versions of control tuples the executor waits for; a restart never reuses one
        self.control_versions = itertools.count(int(time.time() * 1000))
        self.reconfigs = Registry()  # the latest reconfiguration of every application
        self.manager = Manager(self.coordinator)
        self.told_budgets: dict[tuple[str, int], int] = {}  # (app, worker) -> FLOW_CONTROL sent
        self.progress: dict[str, JobProgress] = {}  # guaranteed apps: checkpoints, the end
        self.activated: dict[str, tuple[float, frozenset[int]]] = {}  # app -> when, spouts
        self.spark_totals = SparkTotals()  # GET /metrics: Spark progress summed per node
        self.metrics_registry = metrics_registry(self, lookup_service_brick)
        self.refresh_desired()
        kwargs["wsgi"].register(TyphoonRest, {"core": self, "token": self.settings.api_token})
        set_read_tokens(kwargs["wsgi"], self.settings.read_token, self.settings.api_token)
        self._init_recovery(kwargs["wsgi"])  # a guarantee brings its own recovery
        start_timer(self, self.settings.poll_interval, EventPollCoordinator)
        start_timer(self, self.settings.metrics_interval, EventMetricsRound)

    # what the REST API and GET /metrics read (controller/rest.py, controller/metrics.py)
    datapaths = property(lambda self: self.sync.datapaths)
    installed = property(lambda self: self.sync.installed)
    installed_groups = property(lambda self: self.sync.installed_groups)
    port_up = property(lambda self: self.sync.port_up)
    drops = property(lambda self: self.channel.drops)
    acks = property(lambda self: self.channel.acks)
    rates = property(lambda self: self.channel.rates)
    responses = property(lambda self: self.channel.responses)
    worker_metrics = property(lambda self: self.channel.worker_metrics)

    # ----- switches ------------------------------------------------------------------------

    def _send(self, dp: Datapath, msgs: Iterable[Any]) -> None:
        """The one place that writes to a switch."""
        for msg in msgs:
            dp.send_msg(msg)

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev):
        dp = ev.msg.datapath
        msgs = self.sync.connected(dp)
        self.absent.connected(self.view.host_of_dpid(dp.id))
        self.logger.info(
            "switch connected: dpid=%016x host=%s", dp.id, self.view.host_of_dpid(dp.id)
        )
        self._send(dp, msgs)

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats(self, ev):
        dp = ev.msg.datapath
        if self.sync.flow_stats(dp, ev.msg.body, bool(ev.msg.flags & dp.ofproto.OFPMPF_REPLY_MORE)):
            n = len(self.sync.installed[dp.id])
            self.logger.info("switch %016x holds %d rules; reconciling", dp.id, n)
            self.reconcile(dp)

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, MAIN_DISPATCHER)
    def _group_desc(self, ev):
        dp = ev.msg.datapath
        more = bool(ev.msg.flags & dp.ofproto.OFPMPF_REPLY_MORE)
        if self.sync.group_descs(dp, ev.msg.body, more):
            self.reconcile(dp)

    @set_ev_cls(ofp_event.EventOFPMeterConfigStatsReply, MAIN_DISPATCHER)
    def _meter_config(self, ev):
        dp = ev.msg.datapath
        more = bool(ev.msg.flags & dp.ofproto.OFPMPF_REPLY_MORE)
        if self.sync.meter_configs(dp, ev.msg.body, more):
            self.reconcile(dp)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, MAIN_DISPATCHER)
    def _error(self, ev):
        msg = ev.msg
        dp = msg.datapath
        self.logger.warning(
            "switch %016x: OpenFlow error type=%d code=%d", dp.id, msg.type, msg.code
        )
        if self.sync.request_failed(dp, bytes(msg.data or b"")):
            self.reconcile(dp)

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev):
        if ev.state == DEAD_DISPATCHER and self.sync.disconnected(ev.datapath):
            self.logger.info("switch disconnected: dpid=%016x", ev.datapath.id)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier(self, ev):
        self.sync.barrier_reply(ev.msg.datapath.id, ev.msg.xid)

    def reconcile(self, dp: Datapath) -> None:
        """Make one switch hold exactly the desired rules; touch nothing that is right."""
        host = self.view.host_of_dpid(dp.id)
        desired = self.desired_rules.get(host, DEFAULT_RULES)
        groups = self.desired_groups.get(host, frozenset())
        meters = self.desired_meters.get(host, frozenset())
        self._send(dp, self.sync.reconcile(dp, host, desired, groups, meters))

    def refresh_desired(self) -> None:
        """Recompute every bridge's rules and groups from the view and the apps' sources."""
        self.desired_rules, self.desired_groups = self.composer.compose(self.view)
        self.desired_meters = self.composer.meters()

    def reconcile_all(self) -> None:
        self.reconciling = True
        try:
            for dp in list(self.sync.datapaths.values()):
                self.reconcile(dp)
        finally:
            self.reconciling = False

    def synced(self) -> bool:
        """Every connected switch holds the desired rules (barriers answered)."""
        return self.sync.synced()

    def connected_hosts(self) -> set[str | None]:
        return {self.view.host_of_dpid(d) for d in self.sync.datapaths}

    def send_to_host(self, host: str, build: Callable[[Datapath], list[Any]]) -> bool:
        """Write ``build(dp)`` to ``host``'s switch; False if it is not connected."""
        dp = self._dp_of_host(host)
        if dp is None:
            return False
        self._send(dp, build(dp))
        return True

    # ----- rule sources (controller/rules/composer.py) -------------------------------------------

    def set_rules(self, source: Source, owner: str, value: Any) -> None:
        """Replace ``owner``'s contribution of kind ``source``; installed now.

        Setting it again re-applies it (the owner's inputs changed, e.g. new weights)."""
        self.composer.set(source, owner, value)
        self.refresh_desired()
        self.reconcile_all()

    def clear_rules(self, source: Source, owner: str) -> None:
        if self.composer.clear(source, owner):
            self.refresh_desired()
            self.reconcile_all()

    # ----- coordinator ---------------------------------------------------------------------

    @set_ev_cls(EventPollCoordinator)
    def _poll(self, ev):
        self._decide_recovery()
        try:
            self._poll_coordinator()
        except Exception:  # a bad record must not stop the controller
            self.logger.exception("reading the coordinator failed")

    def _poll_coordinator(self) -> None:
        version, keys = self.coordinator.changes_since(self.version)
        # reports and debugger records leave the view as it is (controller/rules/view.py)
        changed = version != self.version and any(map(rereads_view, keys))
        self.version = version
        if changed:
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
        finish_jobs(self.view, self.coordinator, self.manager, self.logger)

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
                if not hosts <= self.connected_hosts():
                    continue
                self.send_control(name, app.spout_workers(), ControlTuple(Control.ACTIVATE, {}))
                self.activated[name] = (time.monotonic(), frozenset(app.spout_workers()))
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
        """FLOW_CONTROL to workers whose budget changed (``controller/budgets.py``)."""
        for name, wid, budget in budget_updates(self.view, self.told_budgets, self.logger):
            ct = ControlTuple(Control.FLOW_CONTROL, {"budget": budget})
            if self.send_control(name, [wid], ct):
                self.told_budgets[(name, wid)] = budget

    # ----- control tuples ------------------------------------------------------------------

    def send_control(self, app: str, worker_ids: Iterable[int], ct: ControlTuple) -> int:
        """PacketOut one control tuple to each worker's port; returns how many were sent."""
        view = self.view.apps.get(app)
        if view is None:
            raise KeyError(f"no application named {app!r}")
        app_id = view.physical.app_id
        worker_ids = list(worker_ids)
        if ct.type == Control.DEACTIVATE and app in self.activated:
            # a spout stopped on purpose is not one whose ACTIVATE was lost
            at, spouts = self.activated[app]
            self.activated[app] = (at, spouts - set(worker_ids))
        mtu = self.view.cluster.mtu or DEFAULT_MTU  # control tuples fit the fabric too
        sent = 0
        for wid in worker_ids:
            w = view.physical.by_id(wid)
            dp = self._dp_of_host(w.host)
            if dp is None:
                if note := self.absent.note(w.host):
                    self.logger.info("app %s: %s", app, note)
                continue
            parser, ofp_ = dp.ofproto_parser, dp.ofproto
            self._send(
                dp,
                [
                    parser.OFPPacketOut(
                        datapath=dp,
                        buffer_id=ofp_.OFP_NO_BUFFER,
                        in_port=ofp_.OFPP_CONTROLLER,
                        actions=[parser.OFPActionOutput(w.port)],
                        data=frame,
                    )
                    for frame in self.channel.frames(app_id, wid, ct, mtu)
                ],
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
        rid = self.channel.next_request_id()
        return self.send_control(
            app, worker_ids, ControlTuple(Control.METRIC_REQ, {"request_id": rid})
        )

    @set_ev_cls(EventMetricsRound)
    def _metrics_round(self, ev):
        for name, app in list(self.view.apps.items()):
            if app.state.get("active"):
                try:
                    self.request_metrics(name)
                except Exception:
                    self.logger.exception("metrics request for %s failed", name)

    def _dp_of_host(self, host: str) -> Datapath | None:
        info = self.view.cluster.hosts.get(host)
        return self.sync.datapaths.get(info.dpid) if info else None

    # ----- packet-in: worker replies -------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev):
        for reply in self.channel.receive(bytes(ev.msg.data), self.view.app_by_id):
            self._worker_reply(reply)

    def _worker_reply(self, reply: Reply) -> None:
        now = time.monotonic()
        app, worker_id, metrics = reply.app, reply.worker, reply.metrics
        if "ack" in metrics:
            self.channel.record_ack(app, worker_id, metrics["ack"], metrics["version"])
            self.send_event_to_observers(
                EventWorkerAck(app, worker_id, metrics["ack"], metrics["version"], now)
            )
            return
        metrics = self.channel.record_metrics(reply)
        self.coordinator.put_metrics(app, worker_id, metrics)
        self._guarantee_progress(app, worker_id, metrics)
        self._activation_progress(app, worker_id, metrics)
        self.send_event_to_observers(EventWorkerMetrics(app, worker_id, metrics, now))
        self._recovery_metrics(app, worker_id, metrics, now)
        spark = metrics.get("spark")
        if isinstance(spark, dict):
            self._spark_progress(app, worker_id, spark, now)

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
        if not self.sync.port_changed(dp.id, port, up):
            return
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
            self._recovery_worker_down(app, w.worker_id, host, port, reason, now)

    # ----- reconfiguration (stable topology update, paper §3.5) -----------------------------

    def next_control_version(self) -> int:
        return next(self.control_versions) & 0x7FFFFFFFFFFFFFFF

    def acked(self, app: str, what: str, version: int) -> set[int]:
        """Workers that confirmed the control tuple ``what`` with ``version``."""
        return self.channel.acked(app, what, version)

    def rules_ready(self, app: str, version: int) -> bool:
        """The view holds ``version`` of ``app`` and every connected switch confirmed its rules."""
        view = self.view.apps.get(app)
        if view is None or view.physical.version < version or self.reconciling:
            return False
        hosts = {w.host for w in view.physical.workers}
        return hosts <= self.connected_hosts() and self.synced()

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
