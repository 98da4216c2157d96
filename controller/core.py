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
(apps contribute rule specs, the core installs them), ``view``, ``reconcile_all``.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Iterable

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
from controller.reconcile import diff
from controller.rest import TyphoonRest
from controller.ryu_compat import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    Datapath,
    RyuApp,
    WSGIApplication,
    cfg,
    hub,
    lookup_service_brick,
    ofp_event,
    ofproto_v1_3,
    set_ev_cls,
)
from controller.view import ClusterView
from typhoon import wire
from typhoon.coordinator import open_coordinator
from typhoon.wire import Control, ControlTuple, Kind, WireError

CONF = cfg.CONF
CONF.register_opts(
    [
        cfg.StrOpt("coordinator", default="", help="coordinator URL or SQLite path"),
        cfg.FloatOpt("poll_interval", default=0.05, help="seconds between coordinator reads"),
        cfg.FloatOpt("metrics_interval", default=1.0, help="seconds between METRIC_REQ rounds"),
        cfg.StrOpt("api_token", default="", help="token required by REST requests that change"),
    ],
    group="typhoon",
)

APP_NAME = "TyphoonController"
DEFAULT_RULES = frozenset(compile_default_rules())


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
        self.coordinator = open_coordinator(CONF.typhoon.coordinator or None)
        self.version = -1
        self.view = ClusterView.read(self.coordinator)
        self.desired_rules: dict[str, frozenset[RuleSpec]] = {}
        self.datapaths: dict[int, Datapath] = {}
        self.installed: dict[int, set[RuleSpec]] = {}  # dpid -> rules on the switch
        self._stats: dict[int, list[RuleSpec]] = {}  # flow stats being received
        self.barriers: dict[int, int] = {}  # dpid -> xid of the barrier we wait for
        self.extra: dict[str, dict[str, frozenset[RuleSpec]]] = {}  # owner -> host -> rules
        self.port_up: dict[tuple[int, int], bool] = {}
        self.ctrl_seq: dict[tuple[int, int], int] = {}
        self.reassembly: dict[bytes, wire.Reassembler] = {}
        self.request_ids = itertools.count(1)
        self.physical_versions: dict[str, int] = {}
        self.drops: dict[str, int] = {}
        self.acks: collections.deque[dict] = collections.deque(maxlen=1000)
        # request id -> worker -> metrics, for callers waiting for their own METRIC_REQ
        self.responses: collections.OrderedDict[int, dict[int, dict]] = collections.OrderedDict()
        self.refresh_desired()
        kwargs["wsgi"].register(TyphoonRest, {"core": self, "token": CONF.typhoon.api_token})
        self.threads.append(hub.spawn(self._watch_loop))
        self.threads.append(hub.spawn(self._metrics_loop))

    # ----- switches ------------------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev):
        dp = ev.msg.datapath
        self.datapaths[dp.id] = dp
        self.installed.pop(dp.id, None)
        self._stats[dp.id] = []
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

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev):
        dp = ev.datapath
        if ev.state == DEAD_DISPATCHER and dp.id is not None and self.datapaths.get(dp.id) is dp:
            del self.datapaths[dp.id]
            self.installed.pop(dp.id, None)
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
        if installed is None:
            return  # flow stats not read yet: the stats reply will reconcile
        host = self.view.host_of_dpid(dp.id)
        desired = self.desired_rules.get(host, DEFAULT_RULES)
        plan = diff(desired, installed)
        if not (plan.add or plan.modify or plan.delete):
            return
        for spec in plan.delete:
            dp.send_msg(ofp.flow_mod(dp, spec, "delete"))
        for spec in plan.modify:
            dp.send_msg(ofp.flow_mod(dp, spec, "modify"))
        for spec in plan.add:
            dp.send_msg(ofp.flow_mod(dp, spec, "add"))
        self.installed[dp.id] = set(desired)
        barrier = dp.ofproto_parser.OFPBarrierRequest(dp)
        dp.set_xid(barrier)
        self.barriers[dp.id] = barrier.xid
        dp.send_msg(barrier)
        self.logger.info(
            "switch %s: +%d ~%d -%d rules", host, len(plan.add), len(plan.modify), len(plan.delete)
        )

    def refresh_desired(self) -> None:
        """Recompute every bridge's rule set from the view and the apps' extra rules."""
        merged: dict[str, frozenset[RuleSpec]] = {}
        for per_host in self.extra.values():
            for host, rules in per_host.items():
                merged[host] = merged.get(host, frozenset()) | rules
        self.desired_rules = self.view.desired(merged)

    def reconcile_all(self) -> None:
        for dp in list(self.datapaths.values()):
            self.reconcile(dp)

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
            hub.sleep(CONF.typhoon.poll_interval)

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
                self.coordinator.put_app_state(
                    name, {**state, "active": True, "activated_at": time.time()}
                )
                self.logger.info("app %s: all workers attached, spouts activated", name)
            elif state.get("drain") and not state.get("drained"):
                self.send_control(
                    name, app.spout_workers(), ControlTuple(Control.DRAIN, {"version": 0})
                )
                self.coordinator.put_app_state(name, {**state, "drained": True})
                self.logger.info("app %s: sources drained on request", name)

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
            worker_ids = [
                wid for wid, s in view.statuses.items() if s.state in ("attached", "running")
            ]
        rid = next(self.request_ids) & 0x7FFFFFFF
        return self.send_control(
            app, worker_ids, ControlTuple(Control.METRIC_REQ, {"request_id": rid})
        )

    def _metrics_loop(self):
        while True:
            hub.sleep(CONF.typhoon.metrics_interval)
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
            self.send_event_to_observers(
                EventWorkerAck(app, worker_id, metrics["ack"], metrics["version"], now)
            )
            return
        metrics = {**metrics, "request_id": request_id}
        self.responses.setdefault(request_id, {})[worker_id] = metrics
        while len(self.responses) > 256:
            self.responses.popitem(last=False)
        self.coordinator.put_metrics(app, worker_id, metrics)
        self.send_event_to_observers(EventWorkerMetrics(app, worker_id, metrics, now))

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
