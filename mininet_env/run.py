"""Run a topology end to end on an emulated cluster over the ``sdn`` transport.

Order of events: Mininet bridges and links -> coordinator (cluster written)
-> Ryu controller (connects to every bridge) -> one agent per host ->
manager submits the topology -> agents launch workers and attach their TAP
ports, the controller installs the rules and, once every worker port is up,
sends ACTIVATE -> live rates from the metrics the controller collects ->
every worker finished -> report -> kill (workers, ports and rules go) ->
teardown, which also runs when anything above fails or is interrupted.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mininet_env.drops import drop_counters, drops_between, split_dead_address_drops
from mininet_env.fabric import FabricPlan
from mininet_env.network import EmulatedNetwork
from mininet_env.processes import (
    POLL_S,
    PhaseClock,
    free_port,
    reap_leftovers,
    start_agent,
    start_controller,
    wait_until,
)
from typhoon.checkpoint import guarantee_of
from typhoon.client import ApiCallError, Client, Endpoint
from typhoon.coordinator import open_coordinator
from typhoon.live import LiveRates
from typhoon.manager import Manager
from typhoon.private_files import write_private
from typhoon.report import build_report, read_worker_reports, worker_failures
from typhoon.supervised import Supervised, stop_all
from typhoon.topology.batching import DEFAULTS, Batching
from typhoon.topology.model import Topology
from typhoon.wire import mac_str, worker_mac

log = logging.getLogger(__name__)


@dataclass
class SdnRunOptions:
    plan: FabricPlan = field(default_factory=FabricPlan)
    apps: list[str] = field(default_factory=list)  # extra Ryu apps, e.g. apps/fault_detector.py
    duration: float | None = None
    # the file's config wins over these (EmulatedCluster.submit)
    batch_size: int = DEFAULTS.batch_size
    max_delay_ms: float = DEFAULTS.max_delay_ms
    live: bool = True
    live_every: float = 1.0
    timeout: float = 900.0
    start_timeout: float = 60.0
    controller_config: str = ""  # extra lines for the Ryu config file
    workdir: Path | None = None
    # end the run once a worker failed (after failure_grace s, so its peers' errors show too);
    # None: unless the fault detector, which replaces failed workers, is loaded, or the
    # topology asks for a guarantee (the core then recovers it: controller/core_recovery.py)
    stop_on_failure: bool | None = None
    failure_grace: float = 2.0


class EmulatedCluster:
    """Bridges, coordinator, controller and agents of one emulated cluster."""

    def __init__(self, options: SdnRunOptions, out: TextIO = sys.stderr) -> None:
        self.options = options
        self.out = out
        self._tmp = None
        if options.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="typhoon-sdn-")
        self.workdir = Path(options.workdir or self._tmp.name)  # type: ignore[union-attr]
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.coordinator_url = str(self.workdir / "coordinator.db")
        self.coordinator = open_coordinator(self.coordinator_url)
        self.ofp_port = free_port()
        self.wsapi_port = free_port()
        self.token = secrets.token_hex(16)
        self.rest_url = f"http://127.0.0.1:{self.wsapi_port}/typhoon"
        self.network = EmulatedNetwork(options.plan, self.ofp_port)
        self.controller: Supervised | None = None
        self.agents: list[Supervised] = []
        self.manager = Manager(self.coordinator)
        self.phases: dict[str, float] = {}  # seconds per step of start() and close()

    def children(self) -> list[Supervised]:
        return [c for c in [self.controller, *self.agents] if c is not None]

    def start(self) -> None:
        """Everything up to agents ready; raises (after cleanup by close()) on failure.

        The agents start with the controller (a Python process that imports Ryu: the
        longest step) and load while it does; they only act once a topology is
        submitted, after every bridge has connected.  Each step's seconds go to
        ``self.phases`` (the ``startup`` benchmark reads them).
        """
        o = self.options
        clock = PhaseClock(self.phases)
        cluster = o.plan.cluster()
        self.coordinator.put_cluster(cluster)
        self.controller = self._start_controller_process()
        for host in cluster.host_names():
            self.agents.append(start_agent(self.workdir, self.coordinator_url, host))
        self._wait_listening()
        clock.lap("controller")
        # after the controller listens: a bridge refused once retries only a second later.
        # Their controller records reconnect within a second of a controller restart
        # (Mininet's reconnectms=1000 sets max_backoff; OVS's own default is 8 s)
        self.network.start()
        clock.lap("network")
        self._wait_connected()
        clock.lap("connect")
        self.write_client_config()

    def write_client_config(self) -> Path:
        """``WORKDIR/client.ini``: this cluster's controller for the REST verbs, e.g.
        ``typhoon debug attach NAME WORKER --config WORKDIR/client.ini`` (typhoon.client)."""
        path = self.workdir / "client.ini"
        # the token allows changes: 0600 from the first byte
        write_private(path, f"[typhoon]\ncontroller = {self.rest_url}\ntoken = {self.token}\n")
        return path

    def _start_controller_process(self) -> Supervised:
        o = self.options
        return start_controller(
            self.workdir,
            self.coordinator_url,
            o.apps,
            self.ofp_port,
            self.wsapi_port,
            f"api_token = {self.token}\n{o.controller_config}",
        )

    def _launch_controller(self) -> None:
        self.controller = self._start_controller_process()
        self._wait_listening()

    def _wait_listening(self) -> None:
        wait_until(
            lambda: port_open(self.ofp_port),
            self.options.start_timeout,
            "the controller to listen",
            self.children(),
            interval=POLL_S,
        )

    def _wait_connected(self) -> None:
        """Until the controller holds every bridge's connection.  Asked of the controller
        (``GET /metrics``): OVS refreshes ``Controller.is_connected`` in its database
        only every few seconds, which made this wait 0-5 s longer than the connection."""
        uuids = self._controllers(self.network.bridges())

        def connected() -> bool:
            seen = self._switches_seen()
            return seen if seen is not None else bool(uuids) and self._connected(uuids)

        wait_until(
            connected,
            self.options.start_timeout,
            "every bridge to connect to the controller",
            self.children(),
            interval=POLL_S,
        )

    def stop_controller(self, sig: int = signal.SIGKILL) -> None:
        """Take the controller away (SIGKILL: no goodbye); the bridges keep their rules."""
        if self.controller is not None:
            self.controller.stop(timeout=5, sig=sig)
            self.controller = None

    def start_controller(self) -> None:
        """Start the controller again on the same ports; returns once every bridge is back."""
        if self.controller is not None:
            raise RuntimeError("the controller is already running")
        self._launch_controller()
        self._wait_connected()

    def restart_controller(self, down_s: float = 0.0) -> None:
        self.stop_controller()
        time.sleep(down_s)
        self.start_controller()

    def fail_host(self, host: str) -> list[int]:
        """A power cut of emulated ``host``: its agent is SIGKILLed, its bridge deleted
        (the switch connection goes with it, so no port event reports the workers), every
        worker it ran SIGKILLed, and its agent's record removed (as a ZooKeeper session's
        ephemeral node would go).  Returns the workers killed."""
        for agent in [a for a in self.agents if a.name == f"agent-{host}"]:
            # out of the list first: run() (another thread) checks every agent it lists is
            # alive, and must not take this death for a crash between the kill and here
            self.agents.remove(agent)
            agent.stop(timeout=5, sig=signal.SIGKILL)
        bridge = self.options.plan.bridge(self.options.plan.host_names().index(host) + 1)
        subprocess.run(
            ["ovs-vsctl", "--if-exists", "del-br", bridge], capture_output=True, timeout=30
        )
        killed = []
        for name in self.coordinator.physical_names():
            for wid, s in self.coordinator.worker_statuses(name).items():
                if s.host == host and s.pid and s.state != "exited":
                    try:
                        os.kill(s.pid, signal.SIGKILL)
                        killed.append(wid)
                    except ProcessLookupError:
                        pass
        self.coordinator.delete_agent(host)
        return sorted(killed)

    def _switches_seen(self) -> bool | None:
        """Does the controller say every host's switch is connected?  None: it cannot
        say (not serving yet, or an answer without ``typhoon_switch_connected``)."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.wsapi_port}/metrics", headers={"X-Typhoon-Token": self.token}
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:
                text = reply.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return None
        up = switches_connected(text)
        hosts = self.options.plan.host_names()
        return all(up.get(h) for h in hosts) if set(hosts) <= set(up) else None

    @staticmethod
    def _controllers(bridges: list[str]) -> list[list[str]]:
        """Each bridge's controller records (one ovs-vsctl call for all bridges)."""
        args = [a for b in bridges for a in ("--", "get", "Bridge", b, "controller")]
        lines = _vsctl(*args).splitlines()
        return [[u for u in line.strip("[]").split(", ") if u] for line in lines]

    @staticmethod
    def _connected(uuids: list[list[str]]) -> bool:
        """Does OVS say every bridge has a controller connection up?  (one call)"""
        flat = [u for per_bridge in uuids for u in per_bridge]
        args = [a for u in flat for a in ("--", "get", "Controller", u, "is_connected")]
        up = dict(zip(flat, _vsctl(*args).splitlines(), strict=False))
        return all(any(up.get(u) == "true" for u in per_bridge) for per_bridge in uuids)

    def rest(self, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
        """Call the controller's REST API (with the token); returns (status, JSON body)."""
        return rest_call(self.rest_url, method, path, body, self.token)

    def drain(self, name: str, node: str = "source") -> None:
        """DRAIN a spout node (REST): it ends its stream, and every worker below it
        finishes after the end of stream reaches it.  ``force``: DRAIN alone is refused (a
        step of the stable update); ending a spout's stream this way is what is meant."""
        body = {"type": "DRAIN", "body": {"version": 1}, "node": node, "force": True}
        status, reply = self.rest("POST", f"/apps/{name}/control", body)
        if status != 202:
            raise RuntimeError(f"DRAIN of {name}/{node} refused: {status} {reply}")

    def submit(self, topology: Topology) -> None:
        o = self.options  # where the file is silent
        Batching.of(topology.config, Batching(o.batch_size, o.max_delay_ms)).write(topology.config)
        self.manager.submit(topology)

    def wait_active(self, name: str) -> None:
        wait_until(
            lambda: (self.coordinator.get_app_state(name) or {}).get("active"),
            self.options.start_timeout,
            f"topology '{name}' to become active",
            self.children(),
            interval=POLL_S,
        )

    def report_dir(self, name: str) -> Path:
        return self.workdir / name / "reports"

    def wait_finished(self, name: str, on_tick: Callable[[float], None] | None = None) -> bool:
        """Until every worker has exited; drain sources at the duration.  True if clean.

        Under a guarantee (``config: guarantee``) a dead worker that the fault
        detector replaced is recovered, not a failure: the run waits for the
        workers of the current physical topology (``self.recovered`` lists the
        replaced ones).  Without one, every worker ever started must exit 0.
        """
        o = self.options
        started = time.monotonic()
        next_tick = started + o.live_every
        drained = False
        topology = self.coordinator.get_topology(name)
        guaranteed = guarantee_of(topology) != "none"
        seen = {w.worker_id for w in self.coordinator.get_physical(name).workers}
        self.recovered: list[int] = []
        stop_on_failure = o.stop_on_failure
        if stop_on_failure is None:
            stop_on_failure = not guaranteed and not any("fault_detector" in a for a in o.apps)
        failed_at: float | None = None
        while True:
            physical = self.coordinator.get_physical(name)
            current = {w.worker_id for w in physical.workers}
            statuses = self.coordinator.worker_statuses(name)
            seen |= current
            expected = current if guaranteed else seen
            exited = {wid for wid, s in statuses.items() if s.state == "exited"}
            if expected <= exited:
                # every worker the agents ran and the job no longer has: replaced
                self.recovered = sorted(set(statuses) - current) if guaranteed else []
                return all(statuses[w].exit_code == 0 for w in expected)
            now = time.monotonic()
            elapsed = now - started
            if stop_on_failure and failed_at is None:
                if any(statuses[w].exit_code for w in exited):
                    failed_at = now
            if failed_at is not None and now - failed_at > o.failure_grace:
                log.error("a worker of %s failed; ending the run", name)
                return False
            if o.duration is not None and elapsed >= o.duration and not drained:
                drained = True
                state = self.coordinator.get_app_state(name) or {}
                self.coordinator.put_app_state(name, {**state, "drain": True})
            if elapsed > o.timeout:
                log.error("run exceeded %.0f s", o.timeout)
                return False
            for c in self.children():
                if not c.alive():
                    raise RuntimeError(f"{c.name} died during the run:\n{c.tail()}")
            if now >= next_tick:
                next_tick = now + o.live_every
                if on_tick:
                    on_tick(elapsed)
            time.sleep(0.05)

    def kill(self, name: str, timeout: float = 30.0) -> None:
        """Remove the application; returns once no agent runs a worker of it."""
        self.manager.kill(name)
        if not self.manager.wait_stopped(name, timeout=timeout):
            raise TimeoutError(f"workers of '{name}' still running {timeout:.0f} s after kill")

    def run(
        self, topology: Topology, on_tick: Callable[[float], None] | None = None
    ) -> dict[str, Any]:
        """Submit, run until every worker finished, report, kill; the cluster stays up."""
        name = topology.name
        bridges = self.network.bridges()
        drops_before = drop_counters(bridges)
        self.submit(topology)
        self.wait_active(name)
        started = time.monotonic()
        drops: list[tuple[str, str, str]] = []
        try:
            clean = self.wait_finished(name, on_tick)
            # the application's rules are still installed: what did they drop?
            drops = drops_between(drops_before, drop_counters(bridges))
        finally:
            elapsed = time.monotonic() - started
            physical = self.coordinator.get_physical(name)
            statuses = self.coordinator.worker_statuses(name)
            incidents = self.incidents(name)
            self.kill(name)
        # frames toward a dead worker's address belong to its incident, not to the problems
        macs = {mac_str(worker_mac(physical.app_id, i["worker"])): i["worker"] for i in incidents}
        dropped, switch_problems = split_dead_address_drops(drops, macs)
        for i in incidents:
            i["dropped"] = dropped.get(i["worker"], [])
        reports = read_worker_reports(self.report_dir(name))
        failures = worker_failures(
            physical.workers,
            {wid: s.exit_code for wid, s in statuses.items() if s.state == "exited"},
            reports,
            lambda wid: self.workdir / name / f"worker-{wid}.log",
        )
        if self._tmp is not None:  # the logs go with the temp dir: the report keeps no path
            for f in failures:
                f.pop("log")
        return build_report(
            topology,
            reports,
            transport="sdn",
            hosts=self.options.plan.host_names(),
            elapsed_s=round(elapsed, 3),
            ok=clean,
            app_id=physical.app_id,
            recovered=self.recovered,
            incidents=incidents,
            switch_problems=switch_problems,
            failures=failures,
        )

    def incidents(self, name: str) -> list[dict[str, Any]]:
        """The controller's incidents of application ``name`` (``GET /typhoon/faults``), without
        its monotonic times; [] if the controller does not answer (nothing is explained)."""
        try:
            status, body = self.rest("GET", "/faults")
        except ConnectionError as e:
            log.error("incidents of %s unknown: %s", name, e)
            return []
        if status != 200 or not isinstance(body, list):
            log.error("incidents of %s unknown: GET /faults answered %s %s", name, status, body)
            return []
        keep = [i for i in body if isinstance(i, dict) and i.get("app") == name]
        return [{k: v for k, v in i.items() if k not in ("app", "detected")} for i in keep]

    def close(self) -> None:
        """Stop everything the cluster started, also after a failure: the agents (each
        stops its workers), the controller, then whatever an agent that died (a power
        cut, a crash) or did not finish its shutdown left running, then the network."""
        clock = PhaseClock(self.phases)
        stop_all(list(reversed(self.children())))  # the agents, then the controller
        reap_leftovers(self.workdir)
        clock.lap("stop processes")
        self.network.stop()
        clock.lap("network down")
        self.coordinator.close()
        if self._tmp is not None:
            self._tmp.cleanup()


def switches_connected(metrics: str) -> dict[str, bool]:
    """``typhoon_switch_connected{host="h1"} 1.0`` lines of a Prometheus text -> {host: up}."""
    found = {}
    for m in re.finditer(r'^typhoon_switch_connected\{host="([^"]+)"\} (\S+)$', metrics, re.M):
        try:
            found[m.group(1)] = float(m.group(2)) == 1.0
        except ValueError:
            continue
    return found


def _vsctl(*args: str) -> str:
    return subprocess.run(
        ["ovs-vsctl", *args], capture_output=True, text=True, timeout=10
    ).stdout.strip()


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def rest_call(
    base: str,
    method: str,
    path: str,
    body: dict | None = None,
    token: str | None = None,
    timeout: float = 30.0,
) -> tuple[int, Any]:
    """One JSON request to the controller's REST API: (status, body), errors included;
    ConnectionError (an OSError) while nothing answers, so callers can wait for it."""
    client = Client(Endpoint(base, token or ""), timeout, retries=0)
    try:
        return client.exchange(method, path, body)
    except ApiCallError as e:
        raise ConnectionError(e.message) from None


def start_cluster(options: SdnRunOptions, out: TextIO = sys.stderr) -> EmulatedCluster:
    """A started cluster, or (having torn down what it started) the exception."""
    cluster = EmulatedCluster(options, out)
    try:
        cluster.start()
    except BaseException:
        cluster.close()
        raise
    return cluster


def run_sdn(topology: Topology, options: SdnRunOptions, out: TextIO = sys.stderr) -> dict[str, Any]:
    """Run a topology to completion on an emulated cluster and return its report."""
    cluster = EmulatedCluster(options, out)
    live = LiveRates(list(topology.nodes))
    name = topology.name

    def tick(elapsed: float) -> None:
        metrics = cluster.coordinator.get_metrics(name)
        if metrics:
            rates = live.update(elapsed, metrics)
            if options.live:
                print(LiveRates.format(elapsed, rates), file=out, flush=True)

    try:
        cluster.start()
        if options.live:
            print(f"controller REST: --config {cluster.workdir / 'client.ini'}", file=out)
        report = cluster.run(topology, tick)
        report["rates"] = live.history
        return report
    finally:
        cluster.close()
