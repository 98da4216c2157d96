"""Run a stretch of work at a lower CPU priority, then go back to the one before.

An sdn host's agent starts its worker fork server (typhoon.runtime.zygote_server)
while the emulated cluster's controller starts: three zygotes importing the
worker runtime took CPU from the controller on two cores (cluster up 0.2-0.3 s
slower, docs/performance.md, "Start-up").  Their imports run nicer so the
controller goes first; the zygote then goes back to its launcher's priority
before it forks a worker, since a child inherits its parent's nice value.

Going back means lowering the nice value, which Linux allows only with
``CAP_SYS_NICE`` or a ``RLIMIT_NICE`` that covers it: without either, the work
runs at the usual priority, since a zygote stuck nicer would make every worker
nicer too.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CAP_SYS_NICE = 23
MAX_NICE = 19


def may_renice_to(nice: int, status: Path = Path("/proc/self/status")) -> bool:
    """May this process set its nice value back down to ``nice`` (sched(7), setpriority(2))?"""
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or 20 - soft <= nice:
        return True
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


@contextmanager
def nicer(by: int) -> Iterator[bool]:
    """The block runs ``by`` nicer (at most 19) if the nice value can be set back after it;
    yields whether it does."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if by <= 0 or base >= MAX_NICE or not may_renice_to(base):
        yield False
        return
    os.setpriority(os.PRIO_PROCESS, 0, min(MAX_NICE, base + by))
    try:
        yield True
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, base)
