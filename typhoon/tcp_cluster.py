"""Runs a topology over the ``tcp`` transport: the Storm-like baseline, no OVS needed.

The run coordinator here plays the manager and controller roles for tcp:
it schedules workers, launches them (locally, or through a launcher such as
a Mininet host), tells them where their peers listen, sends control tuples on
their control connections, polls METRIC_REQ for live rates, and collects the
report when every worker has finished.
"""

from __future__ import annotations

import itertools
import json
import logging
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from typhoon.checkpoint import guarantee_of
from typhoon.checkpoint.progress import JobProgress
from typhoon.engines import EngineService, plan_engines
from typhoon.live import LiveRates
from typhoon.manager import fresh_checkpoints
from typhoon.operators import BUILTINS
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.tcp import MSG_BOOT, MessageReader, encode_boot, encode_control_message
from typhoon.runtime.tcp_auth import new_secret
from typhoon.supervised import Supervised
from typhoon.tcp_control import serving
from typhoon.tcp_gate import HelloGate
from typhoon.tcp_options import RunOptions
from typhoon.tcp_reconfig import Rescaler
from typhoon.tcp_recovery import IncidentWatch, recover, restart
from typhoon.tcp_report import tcp_report
from typhoon.topology.batching import Batching
from typhoon.topology.chaining import group_of
from typhoon.topology.model import PhysicalTopology, Topology
from typhoon.topology.scheduler import app_id_for, schedule
from typhoon.wire import Control, ControlTuple, WireError, decode_control
from typhoon.worker_specs import tcp_mtu
from typhoon.zygote import Zygote, ZygoteLauncher

log = logging.getLogger(__name__)

Launcher = Callable[[str, list[str], Path], Supervised]
MAX_SERVICE_RESTARTS = 3


def local_launcher(host: str, argv: list[str], logfile: Path) -> Supervised:
    """Start a worker process on this machine (every emulated host is local)."""
    return Supervised.start(logfile.stem, argv, logfile, append=False, own_session=False)


@dataclass
class _WorkerConn:
    worker_id: int
    sock: socket.socket
    reader: MessageReader = field(default_factory=MessageReader)


class TcpCluster:
    """Workers of one topology connected by TCP, with their control connections."""

    def __init__(
        self,
        topology: Topology,
        options: RunOptions,
        workdir: Path | None = None,
        launcher: Launcher = local_launcher,
        out: TextIO = sys.stderr,
    ) -> None:
        self.topology = topology
        self.options = options
        self.launcher = launcher
        self.out = out
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="typhoon-tcp-")
        self.workdir = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.report_dir = self.workdir / "reports"
        self.report_dir.mkdir(parents=True, exist_ok=True)
        self.physical: PhysicalTopology = schedule(
            topology, options.hosts, app_id_for(topology.name), first_port=0
        )
        # engines other than python (spark) need processes next to the workers: a Spark driver
        # per host, launched before the workers and restarted if it dies (typhoon.engines)
        self.topology, self.services = plan_engines(topology, self.physical, self.workdir)
        self.service_procs: dict[str, Supervised] = {}
        self.service_restarts: dict[str, int] = {}
        self.procs: dict[int, Supervised] = {}
        self.launched: dict[int, Any] = {}  # every worker ever launched (a drained one too)
        self.conns: dict[int, _WorkerConn] = {}
        self.sel = selectors.DefaultSelector()
        self.metrics: dict[int, dict[str, Any]] = {}
        self.replies: dict[int, tuple[int, dict[str, Any]]] = {}  # the last (request, metrics)
        self.acks: list[dict[str, Any]] = []
        # Spark progress events from METRIC_RESP (what the controller raises as EventSparkMetrics)
        self.spark_progress: list[dict[str, Any]] = []
        self.request_ids = itertools.count(1)
        # guaranteed processing: checkpoints heard of, and COMPLETE once every worker finished
        self.progress = JobProgress() if guarantee_of(topology) != "none" else None
        self.generation = 0
        self.recovered: list[int] = []  # workers relaunched after a death (a guarantee)
        # one record per death, as the fault detector's on sdn (GET /typhoon/faults)
        self.incidents: list[dict[str, Any]] = []
        self.watch = IncidentWatch()  # what replies say of them (rolled back, back at 80%)
        self.peers: dict[int, tuple[str, int]] = {}
        self.launches: dict[int, int] = {}  # worker -> times launched (peers name the launch)
        if self.progress is not None:
            fresh_checkpoints(topology)  # ManagerError: the store cannot be used
        self.started_at = 0.0
        self.live = LiveRates(list(topology.nodes))
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind((self.listen_address(), 0))
        self.server.listen(256)
        # only workers that know the run's secret (in their spec file) get a control connection
        self.secret = new_secret()
        self.gate = HelloGate(self.server, self.secret)
        self.rejected = self.gate.rejected  # refused connections and streams, by reason
        self.rescaler = Rescaler(self, options.scales)  # `rescaler.request(Scale(...))`
        self.zygote: ZygoteLauncher | None = None
        if launcher is local_launcher and options.zygote:  # last: nothing after it can fail
            operators = sorted({n.operator for n in self.topology.nodes.values()} & set(BUILTINS))
            self.zygote = ZygoteLauncher(
                Zygote(self.workdir / "zygote.log", operators, self.progress is not None)
            )
            self.launcher = self.zygote

    def listen_address(self) -> str:
        if self.options.control_bind:
            return self.options.control_bind
        hosts = self.options.hosts
        addrs = {self.options.bind.get(h, "127.0.0.1") for h in hosts} or {"127.0.0.1"}
        addrs = {"127.0.0.1" if a == "0.0.0.0" else a for a in addrs}
        return addrs.pop() if len(addrs) == 1 else "0.0.0.0"

    # ----- start ---------------------------------------------------------------------------

    def control_address(self, host: str) -> tuple[str, int]:
        addr = self.options.bind.get(host, "127.0.0.1")
        return (addr if addr != "0.0.0.0" else "127.0.0.1", self.server.getsockname()[1])

    def start(self) -> None:
        """Launch every worker, wait for each to say hello, tell them their peers."""
        for svc in self.services:
            self._launch_service(svc)
        for w in self.physical.workers:
            self._launch_worker(w)
        self.peers = self._accept_hellos()
        self._broadcast_peers()
        self._wait_services_ready()
        self.started_at = time.monotonic()

    def _broadcast_peers(self) -> None:
        """Every worker learns where every worker listens (a newcomer, a relaunched one),
        which launch of it that is, and the run generation this is of: under a guarantee
        a worker sends nothing of a generation before it has these (typhoon.runtime.tcp)."""
        gen = max([self.generation, *(self.physical.generation_of(w)[0] for w in self.peers)])
        peers = {str(k): [*v, self.launches.get(k, 0)] for k, v in self.peers.items()}
        boot = encode_boot({"peers": peers, "generation": gen})
        for wid, c in list(self.conns.items()):
            try:
                c.sock.sendall(boot)
            except OSError:  # died since it was last polled: handled on the next turn
                log.warning("worker %d: control connection closed", wid)

    def launch_workers(self, worker_ids: list[int]) -> None:
        """Start workers of the current physical topology (a rescale's newcomers)."""
        for wid in worker_ids:
            self._launch_worker(self.physical.by_id(wid))

    def await_workers(self, worker_ids: list[int]) -> None:
        """Their hellos, then every worker learns their addresses (RuntimeError: late)."""
        if worker_ids:
            self.peers.update(self._accept_hellos(set(worker_ids)))
            self._broadcast_peers()

    def next_version(self) -> int:
        return next(self.request_ids)

    def restart(self, topology: Topology, physical: PhysicalTopology, reason: str) -> None:
        """Every worker again in ``physical``, from a checkpoint (a death mid-rescale)."""
        restart(self, topology, physical, reason)

    def hosts(self) -> list[str]:
        return list(self.options.hosts)

    def _launch_worker(self, w: Any) -> None:
        """Start ``w``'s process, or its chain's (typhoon.topology.chaining), once."""
        group = group_of(self.topology, self.physical, w.worker_id)
        running = [self.procs[m] for m in group if m in self.procs and m != w.worker_id]
        if running and running[0].poll() is None:  # started with its chain
            self.launched[w.worker_id], self.procs[w.worker_id] = w, running[0]
            return
        members = [self.physical.by_id(wid) for wid in group]
        self.launched.update({m.worker_id: m for m in members})
        self.launches.update({m: self.launches.get(m, 0) + 1 for m in group})
        gen = f".g{self.physical.generation}" if self.physical.generation else ""
        argv = [sys.executable, "-m", "typhoon.runtime.worker"]
        argv += [str(self._write_spec(m, gen)) for m in members]
        proc = self.launcher(w.host, argv, self.workdir / f"worker-{group[0]}{gen}.log")
        self.procs.update(dict.fromkeys(group, proc))

    def _write_spec(self, w: Any, gen: str) -> Path:
        o = self.options
        batching = Batching.of(self.topology.config, Batching(o.batch_size, o.max_delay_ms))
        spec = WorkerSpec(
            self.topology,
            self.physical,
            w.worker_id,
            batch_size=batching.batch_size,
            max_delay_ms=batching.max_delay_ms,
            report_dir=str(self.report_dir),
            transport={
                "kind": "tcp",
                "control": list(self.control_address(w.host)),
                "bind": o.bind.get(w.host, "127.0.0.1"),
                "secret": self.secret,  # the spec file is created 0600 (WorkerSpec.save)
                "mtu": tcp_mtu(self.topology.config),
            },
        )
        path = self.workdir / f"worker-{w.worker_id}{gen}.spec.json"
        spec.save(path)
        return path

    def _accept_hellos(self, expected: set[int] | None = None) -> dict[int, tuple[str, int]]:
        """Authenticated hellos of starting workers: every worker (start), or ``expected``."""
        want = set(self.procs) if expected is None else expected
        deadline = time.monotonic() + self.options.start_timeout

        def check(arrived: set[int]) -> None:
            if expected is None:
                self._check_alive(arrived)

        try:
            hellos = self.gate.collect(want, deadline, check)
        except TimeoutError as e:
            raise RuntimeError(
                f"{e}: not all of {len(want)} workers started in "
                f"{self.options.start_timeout:.0f} s; see logs in {self.workdir}"
            ) from None
        for wid, h in hellos.items():
            c = self.conns[wid] = _WorkerConn(wid, h.sock, h.reader)
            self.sel.register(c.sock, selectors.EVENT_READ, c)
        return {wid: (h.host, h.port) for wid, h in hellos.items()}

    def _check_alive(self, started: Container[int]) -> None:
        for wid, p in self.procs.items():
            if p.poll() is not None and wid not in started:
                logfile = self.workdir / f"worker-{wid}.log"
                logtext = logfile.read_text(errors="replace") if logfile.exists() else ""
                raise RuntimeError(f"worker {wid} exited with {p.returncode}:\n{logtext[-2000:]}")

    def _launch_service(self, svc: EngineService) -> None:
        n = self.service_restarts.get(svc.name, 0)
        logfile = self.workdir / (f"{svc.name}.log" if n == 0 else f"{svc.name}.{n}.log")
        self.service_procs[svc.name] = self.launcher(svc.host, svc.argv, logfile)

    def _wait_services_ready(self) -> None:
        deadline = time.monotonic() + self.options.service_timeout
        for svc in self.services:
            while svc.ready_file and not Path(svc.ready_file).exists():
                p = self.service_procs[svc.name]
                if p.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{svc.name} did not start; see {self.workdir}")
                time.sleep(0.1)

    def supervise(self) -> None:
        """Restart an engine service that died (a clean exit means its nodes are done)."""
        for svc in self.services:
            p = self.service_procs.get(svc.name)
            if p is None or p.poll() is None or p.returncode == 0:
                continue
            n = self.service_restarts.get(svc.name, 0)
            if n >= MAX_SERVICE_RESTARTS:
                continue
            self.service_restarts[svc.name] = n + 1
            log.warning("%s exited with %s; restarting it", svc.name, p.returncode)
            self._launch_service(svc)

    # ----- control -------------------------------------------------------------------------

    def connected(self, worker_id: int) -> bool:
        """False once the worker closed its control connection (it finished, or died)."""
        return worker_id in self.conns

    def send(self, worker_id: int, ct: ControlTuple) -> None:
        """Send a control tuple to one worker over its control connection."""
        c = self.conns.get(worker_id)
        if c is None:
            raise KeyError(f"worker {worker_id} is not connected")
        try:
            c.sock.sendall(encode_control_message(ct))
        except OSError:
            log.warning("worker %d: control connection closed", worker_id)

    def workers_of(self, node: str) -> list[int]:
        return [w.worker_id for w in self.physical.of_node(node)]

    def activate(self) -> None:
        for n in self.topology.spouts():
            for wid in self.workers_of(n.name):
                self.send(wid, ControlTuple(Control.ACTIVATE, {}))

    def request_metrics(self) -> None:
        rid = next(self.request_ids)
        for wid, p in self.procs.items():
            if p.poll() is None and wid in self.conns:
                self.send(wid, ControlTuple(Control.METRIC_REQ, {"request_id": rid}))

    def pump(self, timeout: float) -> None:
        """Read METRIC_RESP replies that arrived."""
        for key, _ in self.sel.select(timeout):
            c: _WorkerConn = key.data
            try:
                data = c.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self.sel.unregister(c.sock)
                c.sock.close()
                self.conns.pop(c.worker_id, None)
                continue
            try:
                messages = c.reader.feed(data)
            except WireError as e:  # an oversize length: the stream cannot be resynchronized
                log.warning("worker %d: control stream refused: %s", c.worker_id, e)
                self.rejected["malformed_stream"] = self.rejected.get("malformed_stream", 0) + 1
                self.sel.unregister(c.sock)
                c.sock.close()
                self.conns.pop(c.worker_id, None)
                continue
            for m in messages:
                if not m or m[0] == MSG_BOOT:
                    continue
                try:
                    ct = decode_control(m[1:])
                except WireError:
                    log.warning("worker %d sent a malformed control tuple", c.worker_id)
                    continue
                if ct.type != Control.METRIC_RESP:
                    continue
                metrics = ct.body["metrics"]
                self.replies[ct.body["worker"]] = (ct.body["request_id"], metrics)
                if "ack" in metrics:
                    self.acks.append({"worker": ct.body["worker"], **metrics})
                    self.watch.acked(self.incidents, ct.body["worker"], metrics, time.monotonic())
                else:
                    self._spark_events(metrics)
                    self.metrics[ct.body["worker"]] = metrics
                    self._progress(ct.body["worker"], metrics)

    def _progress(self, worker: int, metrics: dict[str, Any]) -> None:
        """Under a guarantee finished workers wait for COMPLETE (they may roll back)."""
        if self.progress is None:
            return
        self.progress.heard(worker, metrics)
        at = time.monotonic()
        self.watch.heard(self.topology, self.physical, self.incidents, worker, metrics, at)
        for wid in self.progress.to_complete(worker, metrics, self.physical):
            if wid in self.conns:
                self.send(wid, ControlTuple(Control.COMPLETE, {}))

    def _spark_events(self, metrics: dict[str, Any]) -> None:
        spark = metrics.get("spark")
        if isinstance(spark, dict) and isinstance(spark.get("events"), str):
            self.spark_progress.extend(json.loads(spark["events"]))

    # ----- run -----------------------------------------------------------------------------

    def running(self) -> list[int]:
        return [wid for wid, p in self.procs.items() if p.poll() is None]

    def wait(self) -> bool:
        """Run until every worker has exited; drain sources at the duration. True if clean."""
        o = self.options
        next_poll = time.monotonic() + o.live_every
        drained = False
        failed_at: float | None = None
        while self.running():
            now = time.monotonic()
            elapsed = now - self.started_at
            if self.progress is not None:
                for wid in [w for w, p in self.procs.items() if p.returncode]:
                    recover(self, wid)  # a guarantee: replace it, roll its region back
            if failed_at is None and any(p.returncode for p in self.procs.values()):
                failed_at = now  # nothing replaces a failed worker on tcp: its peers would wait
            if failed_at is not None and now - failed_at > o.failure_grace:
                log.error("a worker failed; stopping the others")
                self.stop()
                return False
            for hook in o.on_turn:
                hook(self, elapsed)
            if not self.rescaler.turn(elapsed):  # a rescale failed half-way: the run fails
                log.error("%s; stopping the run", "; ".join(self.rescaler.failed()))
                self.stop()
                return False
            if o.duration is not None and elapsed >= o.duration and not drained:
                drained = True
                for n in self.topology.spouts():
                    for wid in self.workers_of(n.name):
                        if wid in self.conns:  # finite sources may be done already
                            self.send(wid, ControlTuple(Control.DRAIN, {"version": 0}))
            if elapsed > o.timeout:
                log.error("run exceeded %.0f s; stopping workers", o.timeout)
                self.stop()
                return False
            if now >= next_poll:
                next_poll = now + o.live_every
                if self.metrics:
                    rates = self.live.update(elapsed, self.metrics)
                    if o.live:
                        print(LiveRates.format(elapsed, rates), file=self.out, flush=True)
                self.request_metrics()
            self.supervise()
            self.pump(min(0.1, max(0.0, next_poll - time.monotonic())))
        return all(p.returncode == 0 for p in self.procs.values())

    def stop(self) -> None:
        procs = [*self.procs.values(), *self.service_procs.values()]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            p.close_log()

    def close(self) -> None:
        self.stop()
        if self.zygote is not None:  # after its children: their exit codes come through it
            self.zygote.close()
        for c in self.conns.values():
            c.sock.close()
        self.server.close()
        self.sel.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def report(self, clean: bool) -> dict[str, Any]:
        """The run's report (typhoon.tcp_report)."""
        return tcp_report(self, clean)


def run_tcp(topology: Topology, options: RunOptions, out: TextIO = sys.stderr) -> dict[str, Any]:
    """Run a topology to completion over tcp and return its report."""
    workdir = options.workdir / topology.name if options.workdir else None
    cluster = TcpCluster(topology, options, workdir=workdir, out=out)
    try:
        cluster.start()
        with serving(cluster, options.endpoint, out) as endpoint:  # typhoon unchain NAME ...
            cluster.activate()
            clean = cluster.wait()
        report = cluster.report(clean)
        if endpoint is not None:
            report["control_endpoint"] = endpoint.api.summary()
        return report
    finally:
        cluster.close()
