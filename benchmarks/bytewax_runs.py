"""Run a Bytewax cluster of ``processes`` processes on this host and merge what they saw.

What ``python -m bytewax.testing -p N`` does (N processes of one worker each,
``cluster_main`` with every process's address), but each process is
``benchmarks.bytewax_flows`` so that it writes its own result file, and the
launcher keeps a deadline: a process still running after ``timeout`` seconds
is killed and the run is a failed run, never a hang.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.arrivals import Arrivals
from benchmarks.peer_checks import SequenceCheck, check_sequence, merge_counts

REPO = Path(__file__).resolve().parent.parent


@dataclass
class BytewaxRun:
    """One Bytewax run: merged over its processes."""

    flow: str
    processes: int
    ok: bool
    wall_s: float
    error: str = ""
    parts: list[dict[str, Any]] = field(default_factory=list)  # each process's result file

    def counts(self) -> dict[str, int]:
        return merge_counts(p.get("counts", {}) for p in self.parts)

    def arrivals(self) -> Arrivals:
        return Arrivals.merged(Arrivals.from_dict(p["arrivals"]) for p in self.parts)

    def sequence(self, count: int) -> SequenceCheck:
        return check_sequence(
            count,
            [bytes.fromhex(p.get("seen_hex", "")) for p in self.parts],
            sum(p.get("out_of_range", 0) for p in self.parts),
        )

    def sink_rate(self) -> float | None:
        """Tuples/s into the sinks, from the first arrival on any worker to the last."""
        timed = [p for p in self.parts if p.get("first_s") and p.get("last_s")]
        if not self.ok or not timed:
            return None
        span = max(p["last_s"] for p in timed) - min(p["first_s"] for p in timed)
        received = sum(p.get("received", 0) for p in self.parts)
        return received / span if span > 0 else None

    def crossed(self) -> int:
        """Tuples a sink received in a process other than the source's."""
        return sum(p.get("received", 0) for p in self.parts if not p.get("source_here"))

    def to_dict(self) -> dict[str, Any]:
        """The record for ``results.json``: per process, without the bulky tables."""
        bulky = ("seen_hex", "counts", "arrivals")
        return {
            "flow": self.flow,
            "processes": self.processes,
            "ok": self.ok,
            "error": self.error,
            "wall_s": round(self.wall_s, 3),
            "parts": [{k: v for k, v in p.items() if k not in bulky} for p in self.parts],
        }


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports free a moment ago (Bytewax needs them as numbers)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def flow_args(params: dict[str, Any]) -> list[str]:
    """``--name value`` for each parameter of the flow (count, size, seed, ...)."""
    out = []
    for k, v in params.items():
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def run_bytewax(
    flow: str,
    processes: int,
    params: dict[str, Any],
    workdir: Path,
    timeout: float = 120.0,
) -> BytewaxRun:
    """Start ``processes`` processes of ``flow``, wait for all, read their results."""
    if processes < 1:
        raise ValueError("processes must be at least 1")
    workdir.mkdir(parents=True, exist_ok=True)
    addresses = ";".join(f"127.0.0.1:{p}" for p in free_ports(processes))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    outs = [workdir / f"{flow}-p{processes}-{i}.json" for i in range(processes)]
    for f in outs:
        f.unlink(missing_ok=True)
    logs = [(workdir / f"{flow}-p{processes}-{i}.log").open("wb") for i in range(processes)]
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bytewax_flows", flow, "--proc-id", str(i)]
            + ["--addresses", addresses, "--out", str(outs[i])]
            + flow_args(params),
            env=env,
            stdout=logs[i],
            stderr=subprocess.STDOUT,
        )
        for i in range(processes)
    ]
    error = ""
    try:
        for i, p in enumerate(procs):
            left = max(0.1, timeout - (time.monotonic() - t0))
            try:
                rc = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                error = error or f"process {i} still running after {timeout:g} s"
                continue
            if rc != 0:
                error = error or f"process {i} exited with {rc} (see {logs[i].name})"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    wall = time.monotonic() - t0
    parts = []
    for f in outs:
        try:
            parts.append(json.loads(f.read_text()))
        except (OSError, ValueError) as e:
            error = error or f"no result from {f.name}: {e}"
    return BytewaxRun(flow, processes, not error, wall, error, parts)
