"""One application run on a cluster whose controller runs apps (paper §6.2 scenarios).

The fault and autoscale scenarios each submit a topology, measure it while it
runs, and kill it whatever happened: a failed run is recorded with its error
and the scenario goes on to the next.  This module holds that frame and the
two small readers they share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mininet_env.run import EmulatedCluster
from typhoon.topology.model import Topology


def counter(metrics: dict[str, Any], key: str) -> int:
    """A worker's tuples in or out over its data streams (stream 0 is control)."""
    return sum(v for k, v in metrics.get(key, {}).items() if k != "0")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.1) -> Any:
    """Poll until ``predicate`` returns something truthy (returned); TimeoutError after."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


@dataclass
class Outcome:
    ok: bool
    error: str
    wall_s: float


def run_app(c: EmulatedCluster, t: Topology, measure: Callable[[str], None]) -> Outcome:
    """Submit ``t``, wait until it is active, ``measure(name)``, kill it.

    Any exception (of the run or of the kill) becomes the outcome's error."""
    t0 = time.monotonic()
    ok, error, submitted = False, "", False
    try:
        c.submit(t)
        submitted = True
        c.wait_active(t.name)
        measure(t.name)
        ok = True
    except Exception as e:  # one failed run must not end the scenario
        error = f"{type(e).__name__}: {e}"
    finally:
        if submitted and t.name in c.manager.list():
            try:
                c.kill(t.name)
            except Exception as e:
                error, ok = error or f"kill: {e}", False
    return Outcome(ok, error, time.monotonic() - t0)
