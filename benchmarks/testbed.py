"""Where benchmark runs happen: one emulated cluster per transport, kept up between runs.

Starting a cluster (bridges, controller, agents; or Mininet hosts) costs
seconds, a run a few more, so the testbed starts each once and reuses it for
every run that fits; only a change in the number of hosts replaces the ``sdn``
cluster (its manager places workers on every host it has).  Both transports
place workers with the same scheduler on the same host names, so a "remote"
run puts the same workers on the same emulated hosts in both.

Each run has its own topology name, hence its own application id, report
directory and TAP names: nothing of one run can leak into the next.  A run
that fails is recorded as failed (with its error) and the benchmark goes on.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from benchmarks.tcp_fabric import FabricTcpCluster, TcpFabric
from mininet_env.fabric import SHAPES, FabricPlan
from mininet_env.run import EmulatedCluster, SdnRunOptions, start_cluster
from typhoon.ovs_malloc import vswitchd_pid
from typhoon.report import read_worker_reports
from typhoon.tcp_cluster import RunOptions
from typhoon.topology.batching import DEFAULTS, Batching
from typhoon.topology.model import Topology
from typhoon.worker_specs import tcp_mtu, worker_mtu

log = logging.getLogger(__name__)

TRANSPORTS = ("sdn", "tcp")
MAX_HOSTS = 3
FABRIC_MAX_HOSTS = 4  # a run may ask for more hosts than the usual 3 (a 4-host line fabric)


@dataclass
class RunSpec:
    """One run: a topology on one transport, its workers spread over ``hosts`` hosts."""

    transport: str
    hosts: int
    topology: Topology
    batch_size: int = DEFAULTS.batch_size
    max_delay_ms: float = DEFAULTS.max_delay_ms
    duration: float | None = None  # seconds; then sources are drained
    timeout: float = 120.0
    label: str = ""
    bw_mbit: float | None = None  # sdn only: every fabric link shaped to this rate
    shape: str = "mesh"  # how the hosts' bridges are linked (mininet_env.fabric.SHAPES)

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}")
        if not 1 <= self.hosts <= FABRIC_MAX_HOSTS:
            raise ValueError(f"hosts must be in 1..{FABRIC_MAX_HOSTS}")
        if self.shape not in SHAPES:
            raise ValueError(f"fabric shape must be one of {', '.join(SHAPES)}")
        if self.bw_mbit is not None and self.transport != "sdn":
            raise ValueError("only the sdn transport's emulated fabric can be shaped")


@dataclass
class RunResult:
    """What one run measured: the run report plus each worker's own report."""

    transport: str
    hosts: int
    label: str
    ok: bool
    wall_s: float
    error: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)  # raw worker reports
    ovs_cpu_s: float | None = None  # ovs-vswitchd CPU during the run (shared with others!)
    frame_bytes: int | None = None  # the workers' frame size (typhoon.worker_specs)

    def node_result(self, node: str) -> dict[str, Any]:
        return (self.report.get("results") or {}).get(node) or {}

    def node_workers(self, node: str) -> list[dict[str, Any]]:
        return [w for w in self.workers if w["node"] == node]

    def to_dict(self) -> dict[str, Any]:
        """The JSON record: the run report without bulky per-tuple detail."""
        results = {}
        for node, r in (self.report.get("results") or {}).items():
            r = {k: v for k, v in r.items() if k not in ("bitmaps", "timeline")}
            if isinstance(r.get("per_worker"), list):  # quantiles live in scenario summaries
                r["per_worker"] = [
                    {k: v for k, v in w.items() if k != "quantiles_s"} for w in r["per_worker"]
                ]
            results[node] = r
        return {
            "transport": self.transport,
            "hosts": self.hosts,
            "label": self.label,
            "ok": self.ok,
            "error": self.error,
            "wall_s": round(self.wall_s, 3),
            "ovs_cpu_s": self.ovs_cpu_s,
            "frame_bytes": self.frame_bytes,
            "elapsed_s": self.report.get("elapsed_s"),
            "workers": self.report.get("workers", []),
            "results": results,
        }


def ovs_cpu_seconds() -> float | None:
    """user+system CPU seconds of ovs-vswitchd so far, or None if it cannot be read."""
    pid = vswitchd_pid()  # OVS_RUNDIR's daemon first, like ovs-vsctl's
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Testbed:
    """The clusters runs execute on; ``close()`` tears everything down."""

    def __init__(self, workdir: Path, out: TextIO = sys.stderr, tcp_mtu: int | None = None) -> None:
        self.workdir = workdir
        self.tcp_mtu = tcp_mtu  # tcp runs' frame size over their topologies' (None: theirs)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.sdn: EmulatedCluster | None = None
        self.sdn_hosts = 0
        self.sdn_bw_mbit: float | None = None
        self.sdn_shape = "mesh"
        self.tcp: TcpFabric | None = None
        self.names = itertools.count(1)
        self.started_s: dict[str, float] = {}  # how long bringing each cluster up took
        # names and addresses of our own: a second benchmark, `make demo` or a test may
        # run on this machine at the same time (bridges tb<token>1.., tt<token>1..)
        token = secrets.token_hex(2)
        self.sdn_prefix, self.tcp_prefix = f"tb{token}", f"tt{token}"
        self.subnet = f"10.213.{int(token, 16) % 250 + 1}"

    # ----- clusters ------------------------------------------------------------------------

    def sdn_cluster(
        self, hosts: int, bw_mbit: float | None = None, shape: str = "mesh"
    ) -> EmulatedCluster:
        """The sdn cluster with exactly ``hosts`` hosts linked as ``shape`` and fabric
        links shaped to ``bw_mbit`` (None: unshaped), replacing one that differs."""
        want = (hosts, bw_mbit, shape)
        if self.sdn is not None and (self.sdn_hosts, self.sdn_bw_mbit, self.sdn_shape) == want:
            return self.sdn
        self.close_sdn()
        t0 = time.monotonic()
        tag = f"sdn-{hosts}h" + ("" if bw_mbit is None else f"-{bw_mbit:g}mbit")
        tag += "" if shape == "mesh" else f"-{shape}"
        options = SdnRunOptions(
            plan=FabricPlan(hosts=hosts, shape=shape, prefix=self.sdn_prefix, bw_mbit=bw_mbit),
            live=False,
            workdir=self.workdir / tag,
        )
        cluster = start_cluster(options, self.out)
        self.sdn, self.sdn_hosts, self.sdn_bw_mbit = cluster, hosts, bw_mbit
        self.sdn_shape = shape
        self.started_s[tag] = round(time.monotonic() - t0, 2)
        return cluster

    def app_cluster(self, tag: str, apps: list[str], controller_config: str) -> EmulatedCluster:
        """A started 3-host sdn cluster whose controller runs ``apps`` (paper §6.2 scenarios).

        Its controller settings differ per scenario, so it is not shared: the
        caller closes it.  ``tag`` (one letter) keeps its bridges apart from the
        other clusters of this testbed; the idle plain sdn cluster is closed
        first so that its switches do not take CPU from the measurement.
        """
        self.close_sdn()
        options = SdnRunOptions(
            plan=FabricPlan(hosts=MAX_HOSTS, shape="mesh", prefix=f"{self.sdn_prefix}{tag}"),
            apps=apps,
            live=False,
            controller_config=controller_config,
            workdir=self.workdir / f"apps-{tag}",
        )
        t0 = time.monotonic()
        cluster = start_cluster(options, self.out)
        self.started_s[f"apps-{tag}"] = round(time.monotonic() - t0, 2)
        return cluster

    def tcp_fabric(self, hosts: int = MAX_HOSTS, shape: str = "mesh") -> TcpFabric:
        """The tcp baseline's fabric: at least ``hosts`` hosts (3 unless more are asked
        for) linked as ``shape``, replacing one that is smaller or shaped otherwise."""
        hosts = max(hosts, MAX_HOSTS)
        if self.tcp is not None and (self.tcp.n < hosts or self.tcp.plan.shape != shape):
            self.tcp.stop()
            self.tcp = None
        if self.tcp is None:
            t0 = time.monotonic()
            fabric = TcpFabric(hosts, prefix=self.tcp_prefix, subnet=self.subnet, shape=shape)
            try:
                fabric.start()
            except BaseException:
                fabric.stop()
                raise
            self.tcp = fabric
            self.started_s[
                "tcp" if (hosts, shape) == (MAX_HOSTS, "mesh") else f"tcp-{hosts}h-{shape}"
            ] = round(time.monotonic() - t0, 2)
        return self.tcp

    def close_sdn(self) -> None:
        if self.sdn is not None:
            self.sdn.close()
            self.sdn, self.sdn_hosts, self.sdn_bw_mbit = None, 0, None

    def close(self) -> None:
        try:
            self.close_sdn()
        finally:
            if self.tcp is not None:
                self.tcp.stop()
                self.tcp = None

    # ----- runs ----------------------------------------------------------------------------

    def run(self, spec: RunSpec) -> RunResult:
        """Run one topology to completion; failures become a failed result."""
        topology = spec.topology
        topology.name = f"bench{next(self.names):04d}-{topology.name}"[:60]
        Batching(spec.batch_size, spec.max_delay_ms).write(topology.config)
        if spec.transport == "tcp" and self.tcp_mtu is not None:
            topology.config["tcp"] = {**(topology.config.get("tcp") or {}), "mtu": self.tcp_mtu}
        frames = (
            tcp_mtu(topology.config)
            if spec.transport == "tcp"
            else worker_mtu(topology.config, None)  # the emulated fabric carries 65,000
        )
        cpu0 = ovs_cpu_seconds()
        t0 = time.monotonic()
        try:
            if spec.transport == "sdn":
                report, workers = self._run_sdn(spec)
            else:
                report, workers = self._run_tcp(spec)
            # a run that lost, duplicated or dropped anything is a failed run, not a point
            problems = report.get("problems") or []
            if report.get("ok"):
                error = ""
            elif problems:
                error = "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else "")
            else:
                error = "a worker failed or the run timed out"
            result = RunResult(
                spec.transport,
                spec.hosts,
                spec.label,
                bool(report.get("ok")),
                time.monotonic() - t0,
                error,
                report,
                workers,
            )
        except Exception as e:  # one failed run must not end the benchmark
            log.debug("run failed", exc_info=True)
            detail = traceback.format_exception_only(e)[-1].strip()
            result = RunResult(spec.transport, spec.hosts, spec.label, False, 0.0, detail)
            result.wall_s = time.monotonic() - t0
        cpu1 = ovs_cpu_seconds()
        if cpu0 is not None and cpu1 is not None:
            result.ovs_cpu_s = round(cpu1 - cpu0, 3)
        result.frame_bytes = frames
        return result

    def _run_sdn(self, spec: RunSpec) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        cluster = self.sdn_cluster(spec.hosts, spec.bw_mbit, spec.shape)
        cluster.options.duration = spec.duration
        cluster.options.timeout = spec.timeout
        name = spec.topology.name
        try:
            report = cluster.run(spec.topology)
        except BaseException:
            # run() kills what it submitted only once the topology is active
            if name in cluster.manager.list():
                try:
                    cluster.kill(name)
                except Exception:
                    log.exception("could not remove the failed run %s", name)
            raise
        return report, read_worker_reports(cluster.report_dir(name))

    def _run_tcp(self, spec: RunSpec) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        fabric = self.tcp_fabric(spec.hosts, spec.shape)
        options = RunOptions(
            hosts=fabric.host_names()[: spec.hosts],
            bind=fabric.bind(),
            duration=spec.duration,
            batch_size=spec.batch_size,
            max_delay_ms=spec.max_delay_ms,
            live=False,
            timeout=spec.timeout,
        )
        workdir = self.workdir / "tcp" / spec.topology.name
        cluster = FabricTcpCluster(spec.topology, options, fabric, workdir=workdir, out=self.out)
        try:
            cluster.start()
            cluster.activate()
            clean = cluster.wait()
            report = cluster.report(clean)
        finally:
            cluster.close()
        return report, read_worker_reports(cluster.report_dir)
