"""Weighted load balancer (paper §4, docs/design.md §6): ``ryu-manager apps/load_balancer.py``.

For every stream with the ``sdn`` grouping the app has the core install, on
each bridge that holds a sender, an OpenFlow select group for the receiving
node and a rule per sender that hands the node's load-balancer slot addresses
to it (``controller/rules/groups.py``; the core reconciles groups like rules, so a
restarted controller finds and keeps them).  Once a sender's bridge holds
them, the app switches that sender's stream to the load-balancer address with a
ROUTING control tuple (``balanced: true``); from then on the sender writes each
batch to the next of the node's 256 slot addresses and the switch picks the
worker by bucket (one hash entry each).  Without this app nothing switches: ``sdn`` streams go
to worker addresses like shuffle.  Flow control for balanced frames is a group
window per stream (``typhoon/runtime/lb_credits.py``), as lossless as a link's.

Every ``interval`` seconds the app recomputes each node's weights from its
workers' METRIC_RESPs (processing time per tuple, queue depth) and the switch's
port statistics (frames dropped toward a worker, port down)
(``controller/load_balancing/balancer.py``).  It installs new weights only when a share moves
by more than ``threshold`` points, logs every decision with its reason, and
warns when the achieved split (bucket counters) is more than ``warn`` points
from the configured one.  A worker whose port goes down leaves the group at
once.  ``GET /typhoon/lb`` (or ``/typhoon/apps/NAME/lb``) shows configured
versus achieved split per node.

Settings: section ``[load_balancer]`` of the Ryu config file, declared once by
``LbSettings`` in ``controller/load_balancing/balancer.py``
(``controller/settings.py``); the table is in ``docs/load_balancer.md``.
"""

from __future__ import annotations

import collections
import time
from typing import Any

from controller.app_support import EventTick, TyphoonApp, report_rest, start_ticks
from controller.events import (
    EventTopologyChanged,
    EventWorkerAck,
    EventWorkerDown,
    EventWorkerMetrics,
    EventWorkerUp,
)
from controller.framework.ryu_compat import (
    MAIN_DISPATCHER,
    ofp_event,
    require_app,
    set_ev_cls,
)
from controller.load_balancing.balancer import Decision, LbSettings, NodeBalancer, fmt_split
from controller.load_balancing.senders import SenderSwitch
from controller.options import read_settings, register_settings
from controller.rules.groups import Balanced, balanced_streams, compile_lb_all, parse_group_id
from controller.services import Services, Source, services
from typhoon.topology.routing import routes_for
from typhoon.wire import Control, ControlTuple

require_app("controller.core")

register_settings(LbSettings)

OWNER = "load_balancer"
TICK_S = 0.5
REST = report_rest("lb", missing="no balanced stream")
ROUTING_RETRY_S = 2.0
KEEP_DECISIONS = 20


class LoadBalancer(TyphoonApp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = read_settings(LbSettings)
        self.nodes: dict[tuple[str, str], NodeBalancer] = {}
        self.down: dict[str, set[int]] = {}  # app -> workers whose port is down
        self.senders = SenderSwitch(ROUTING_RETRY_S)
        self.buckets: dict[tuple[str, str], dict[str, dict[int, int]]] = {}  # -> host -> counts
        self.decisions: dict[tuple[str, str], collections.deque] = {}
        self.next_decision = time.monotonic() + self.settings.interval_s
        self.next_stats = 0.0
        kwargs["wsgi"].register(REST, {"app": self})
        start_ticks(self, TICK_S)
        self.logger.info("load balancer ready: %s", self.settings)

    def start(self):
        thread = super().start()
        # every app is instantiated by now: the core exists
        self.core().set_rules(Source.GROUPS, OWNER, self.groups)
        return thread

    def stop(self):
        """Put the senders back on worker addresses before the groups can go away."""
        try:
            core = self.core()
            for name, wid, stream in self.senders.switched():
                self._send_routing(core, name, wid, stream, balanced=False)
        except Exception:  # shutting down: best effort
            self.logger.exception("could not switch senders back")
        super().stop()

    @staticmethod
    def core() -> Services:
        """The controller core's services (looked up on use: Ryu may start it after this app)."""
        return services()

    # ----- groups for the core -------------------------------------------------------------

    def groups(self, view) -> tuple[dict[str, frozenset], dict[str, frozenset]]:
        """The core's group provider: every balanced node's group and LB rules, per host."""
        weights: dict[str, dict[int, float]] = {}
        for (name, _), nb in self.nodes.items():
            weights.setdefault(name, {}).update(nb.installed)

        def failed(name: str, e: ValueError) -> None:
            self.logger.error("app %s: cannot compile load-balancer groups: %s", name, e)

        apps = {name: (a.topology, a.physical) for name, a in view.apps.items()}
        return compile_lb_all(apps, view.cluster, weights, self.down, failed)

    def apply(self) -> None:
        """New weights or members: the core recomputes and installs the groups now."""
        self.core().set_rules(Source.GROUPS, OWNER, self.groups)

    # ----- the timer -----------------------------------------------------------------------

    @set_ev_cls(EventTick)
    def _tick(self, ev):
        now = time.monotonic()
        core = self.core()
        live: set[tuple[str, str]] = set()
        for name, app in list(core.view.apps.items()):
            for b in balanced_streams(app.topology, app.physical):
                key = (name, b.node)
                live.add(key)
                nb = self.nodes.get(key)
                if nb is None:
                    nb = self.nodes[key] = NodeBalancer(name, b.node, self.settings)
                    self.logger.info(
                        "app %s: stream %d to node %s is load-balanced by the switch",
                        name, b.stream, b.node,
                    )  # fmt: skip
                nb.set_members(w.worker_id for w in b.receivers)
                self._switch_senders(core, name, app, b, now)
        for key in set(self.nodes) - live:
            del self.nodes[key]
            self.buckets.pop(key, None)
        if now >= self.next_stats:
            self.next_stats = now + self.settings.interval_s / 2
            self._request_stats(core)
        if now >= self.next_decision:
            self.next_decision = now + self.settings.interval_s
            self._decide(now)

    def _request_stats(self, core) -> None:
        """Group bucket counters and port counters from every switch with a balanced node."""
        hosts = core.hosts_with_groups()
        for name in {name for name, _ in self.nodes}:
            app = core.view.apps.get(name)
            if app is not None:
                hosts.update(w.host for w in app.physical.workers)
        for host in sorted(hosts):
            core.request_stats(host, groups=bool(core.groups_wanted(host)))

    def _decide(self, now: float) -> None:
        changed = False
        for key, nb in sorted(self.nodes.items()):
            d = nb.decide(now)
            self._log_decision(key, d)
            changed |= d.install is not None
            warning = nb.split_warning()
            if warning:
                self.logger.warning("app %s node %s: %s", key[0], key[1], warning)
        if changed:
            self.apply()

    def _log_decision(self, key: tuple[str, str], d: Decision) -> None:
        what = "new weights" if d.install is not None else "weights kept"
        self.logger.info("app %s node %s: %s: %s", key[0], key[1], what, d.reason)
        log = self.decisions.setdefault(key, collections.deque(maxlen=KEEP_DECISIONS))
        log.append(
            {
                "time": time.time(),
                "installed": d.install is not None,
                "target": {str(k): round(v, 4) for k, v in sorted(d.target.items())},
                "reason": d.reason,
            }
        )

    # ----- switching senders to the load-balancer address ----------------------------------

    def _switch_senders(self, core, name: str, app, b: Balanced, now: float) -> None:
        """ROUTING ``balanced: true`` to every sender whose bridge holds the node's group."""
        if not core.synced():
            return  # rules or groups still on their way to a switch
        wanted = (app.physical.app_id, b.node_index)

        def holds_group(host: str) -> bool:
            groups = core.groups_on_switch(core.view.cluster.hosts[host].dpid)
            return any(parse_group_id(g.group_id) == wanted for g in groups)

        for wid, again in self.senders.due(name, b, app.statuses, holds_group, now):
            self._send_routing(core, name, wid, b.stream, balanced=True)
            self.logger.info(
                "app %s: worker %d stream %d -> load-balancer address of node %s (%s)",
                name, wid, b.stream, b.node, "again" if again else "its bridge holds the group",
            )  # fmt: skip

    def _send_routing(self, core, name: str, wid: int, stream: int, balanced: bool) -> None:
        app = core.view.apps[name]
        route = next(r for r in routes_for(app.topology, app.physical, wid) if r.stream == stream)
        route.balanced = balanced
        route.version = self.senders.sent((name, wid, stream), time.monotonic())
        core.send_control(name, [wid], ControlTuple(Control.ROUTING, route.to_body()))

    @set_ev_cls(EventWorkerAck)
    def _ack(self, ev):
        self.senders.on_ack(ev.what, ev.version, time.monotonic())

    @set_ev_cls(EventWorkerMetrics)
    def _metrics(self, ev):
        app = self.core().view.apps.get(ev.app)
        if app is None:
            return
        try:
            w = app.physical.by_id(ev.worker_id)
        except KeyError:
            return
        nb = self.nodes.get((ev.app, w.node))
        if nb is not None:
            nb.on_metrics(ev.worker_id, ev.metrics, ev.at)
        self.senders.on_metrics(ev.app, ev.worker_id, ev.metrics.get("balanced") or {}, ev.at)

    # ----- counters from the switches ------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPGroupStatsReply, MAIN_DISPATCHER)
    def _group_stats(self, ev):
        core = self.core()
        host = core.view.host_of_dpid(ev.msg.datapath.id)
        now = time.monotonic()
        specs = {g.group_id: g for g in core.groups_on_switch(ev.msg.datapath.id)}
        for stat in ev.msg.body:
            ids = parse_group_id(stat.group_id)
            spec = specs.get(stat.group_id)
            if ids is None or spec is None or len(spec.buckets) != len(stat.bucket_stats):
                continue
            name = core.view.app_by_id(ids[0])
            app = core.view.apps.get(name) if name else None
            if app is None or ids[1] >= len(app.topology.nodes):
                continue
            node = list(app.topology.nodes)[ids[1]]
            per_host = self.buckets.setdefault((name, node), {})
            per_host[host] = spec.packets_per_worker(bs.packet_count for bs in stat.bucket_stats)
            nb = self.nodes.get((name, node))
            if nb is not None:
                total: dict[int, int] = collections.Counter()
                for c in per_host.values():
                    total.update(c)
                nb.on_buckets(dict(total), now)

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def _port_stats(self, ev):
        core = self.core()
        dpid = ev.msg.datapath.id
        host = core.view.host_of_dpid(dpid)
        if host is None:
            return
        for stat in ev.msg.body:
            found = core.view.worker_at(host, stat.port_no)
            if found is None:
                continue
            name, w = found
            nb = self.nodes.get((name, w.node))
            if nb is not None:
                up = core.port_is_up(dpid, stat.port_no)
                nb.on_port(w.worker_id, stat.tx_dropped, up)

    # ----- workers coming and going --------------------------------------------------------

    def _node_of(self, app_name: str, wid: int) -> tuple[str, NodeBalancer] | None:
        """The balanced node a worker belongs to, if any."""
        app = self.core().view.apps.get(app_name)
        if app is None:
            return None
        try:
            node = app.physical.by_id(wid).node
        except KeyError:
            return None
        nb = self.nodes.get((app_name, node))
        return (node, nb) if nb is not None else None

    @set_ev_cls(EventWorkerDown)
    def _worker_down(self, ev):
        found = self._node_of(ev.app, ev.worker_id)
        if found is None:
            return
        node, nb = found
        if ev.worker_id not in self.down.get(ev.app, set()):
            self.down.setdefault(ev.app, set()).add(ev.worker_id)
            nb.worker(ev.worker_id).port_up = False
            self.logger.info(
                "app %s node %s: worker %d port %s (%s): out of the group now",
                ev.app, node, ev.worker_id, ev.port, ev.reason,
            )  # fmt: skip
            self.apply()

    @set_ev_cls(EventWorkerUp)
    def _worker_up(self, ev):
        self.senders.on_worker_up(ev.app, ev.worker_id)  # switch it again
        if ev.worker_id in self.down.get(ev.app, set()):
            self.down[ev.app].discard(ev.worker_id)
            found = self._node_of(ev.app, ev.worker_id)
            if found is not None:
                found[1].worker(ev.worker_id).port_up = True
            self.logger.info("app %s: worker %d port up: back in its group", ev.app, ev.worker_id)
            self.apply()

    @set_ev_cls(EventTopologyChanged)
    def _topology_changed(self, ev):
        if ev.version is None:  # the application is gone
            for key in [k for k in self.nodes if k[0] == ev.app]:
                del self.nodes[key]
                self.buckets.pop(key, None)
                self.decisions.pop(key, None)
            self.senders.forget(ev.app)
            self.down.pop(ev.app, None)

    # ----- report --------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Per application and balanced node: configured vs achieved split and decisions."""
        out: dict[str, Any] = {}
        for (name, node), nb in sorted(self.nodes.items()):
            r = nb.report()
            r["decisions"] = list(self.decisions.get((name, node), ()))
            r["senders"] = self.senders.report(name)
            r["summary"] = (
                f"configured {fmt_split(nb.installed)}; achieved {fmt_split(nb.achieved())}"
            )
            out.setdefault(name, {})[node] = r
        return out
