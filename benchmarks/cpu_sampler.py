"""CPU by process group over a run, sampled from ``/proc`` (psutil): who a change costs.

On a two-core machine where source, sink and switch already keep both cores
busy, whatever a feature adds anywhere (the switch's copies, the controller,
a debug worker, the client reading records) comes out of the observed
pipeline's throughput, even when the observed worker's own CPU per tuple
does not move.  A :class:`CpuSampler` thread reads every process's CPU clock
every ``interval`` seconds; :meth:`CpuSampler.cores` gives each group's
average cores over a stretch of wall time, so a scenario can put "before"
and "attached" side by side per process group, next to what the rest of the
machine used and what the hypervisor took.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from typhoon.supervised import command_line

WORKER_MODULE = "typhoon.runtime.worker"


def classify(cmdline: Sequence[str], self_pid: int, pid: int) -> str | None:
    """The group a process belongs to, or None for one the benchmark does not run.

    Workers are named by their node (``worker:<node>``, read from their spec file
    by :meth:`CpuSampler._group`); this gives ``worker`` for them.
    """
    if pid == self_pid:
        return "benchmark process (client)"
    if not cmdline:
        return None
    head = os.path.basename(cmdline[0])
    if head == "ovs-vswitchd":
        return "ovs-vswitchd"
    joined = " ".join(cmdline[:4])
    if "ryu-manager" in joined or "controller.framework.launcher" in joined:
        return "controller"
    if WORKER_MODULE in joined:
        return "worker"
    if "typhoon.runtime.zygote_server" in joined:  # forks the workers (typhoon.zygote)
        return "worker zygote"
    if "typhoon.debug.worker" in joined:
        return "debug worker"
    if "typhoon.agent" in joined:
        return "agents"
    return None


def node_of_spec(path: str) -> str | None:
    """The node a worker spec file names (``worker-N.spec.json``), or None."""
    try:
        d = json.loads(Path(path).read_text())
        wid = d["worker_id"]
        for w in d["physical"]["workers"]:
            if w["worker_id"] == wid:
                return str(w["node"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def pin_nodes(app: str, cores: dict[str, int]) -> dict[str, list[int]]:
    """Pin the workers of ``app`` whose node is a key of ``cores`` to that core.

    Returns the pids pinned per node.  A two-core machine running source, sink and
    ovs-vswitchd switches between a fast and a slow schedule on its own (one-second
    rates move between ~1.0M and ~1.3M tuples/s with nothing changed); a core each
    for the observed pair, as the paper's testbed gave every worker a machine,
    steadies that, while everything else still floats over both cores.
    """
    pinned: dict[str, list[int]] = {}
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if not cmd or WORKER_MODULE not in " ".join(cmd[:4]) or f"/{app}/" not in cmd[-1]:
            continue
        node = node_of_spec(cmd[-1])
        if node in cores:
            try:
                p.cpu_affinity([cores[node] % (os.cpu_count() or 1)])
            except (psutil.Error, OSError):
                continue
            pinned.setdefault(node, []).append(p.pid)
    return pinned


@dataclass
class Sample:
    at: float  # time.time()
    cpu: dict[int, float]  # pid -> user + system seconds so far
    busy: float = 0.0  # the whole machine's non-idle CPU seconds so far (every core)
    steal: float = 0.0  # CPU seconds the hypervisor gave to others


@dataclass
class CpuSampler:
    interval: float = 0.5
    samples: list[Sample] = field(default_factory=list)
    groups: dict[int, str] = field(default_factory=dict)  # pid -> group
    started: dict[int, float] = field(default_factory=dict)  # pid -> create time
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> CpuSampler:
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            cpu: dict[int, float] = {}
            for p in psutil.process_iter(["cmdline", "create_time", "cpu_times"]):
                pid = p.pid
                if pid not in self.groups:
                    group = self._group(command_line(p.info.get("cmdline") or []), me, pid)
                    if group is None:
                        continue
                    self.groups[pid] = group
                    self.started[pid] = p.info.get("create_time") or 0.0
                times = p.info.get("cpu_times")
                if times is not None:
                    cpu[pid] = times.user + times.system
            t = psutil.cpu_times()
            idle = t.idle + getattr(t, "iowait", 0.0)
            steal = getattr(t, "steal", 0.0)
            busy = sum(t) - idle - steal - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
            self.samples.append(Sample(time.time(), cpu, busy, steal))
            self._stop.wait(self.interval)

    @staticmethod
    def _group(cmdline: list[str], me: int, pid: int) -> str | None:
        group = classify(cmdline, me, pid)
        if group == "worker":
            node = node_of_spec(cmdline[-1]) if cmdline[-1].endswith(".json") else None
            return f"worker {node}" if node else "worker"
        return group

    def cores(self, start: float, end: float) -> dict[str, float]:
        """Average cores each group used from ``start`` to ``end`` (wall time).

        A process is charged the CPU between the first and last samples inside the
        stretch; one that started inside it is charged from zero (its start-up
        counts: it is part of what the change costs).
        """
        inside = [s for s in self.samples if start <= s.at <= end]
        if len(inside) < 2:
            return {}
        first, last = inside[0], inside[-1]
        span = last.at - first.at
        out: dict[str, float] = {}
        for pid, cpu in last.cpu.items():
            if pid in first.cpu:
                used = cpu - first.cpu[pid]
            elif self.started.get(pid, 0.0) >= first.at:
                used = cpu
            else:
                continue  # seen only late for another reason: not charged
            group = self.groups[pid]
            out[group] = out.get(group, 0.0) + used / span
        ours = sum(out.values())
        out["other processes and the kernel"] = (last.busy - first.busy) / span - ours
        out["stolen by the hypervisor"] = (last.steal - first.steal) / span
        return {g: round(c, 3) for g, c in sorted(out.items())}
