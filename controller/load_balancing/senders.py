"""Which senders of a balanced stream write to the load-balancer address, free of Ryu.

A sender starts on worker addresses.  Once its bridge holds the receiving
node's group, the load-balancer app (``apps/load_balancer.py``) sends it
ROUTING ``balanced: true``; the sender is switched when it acks that version.
A send not acked within ``retry_s`` is sent again; a sender that restarts
(its port comes up again, or its METRIC_RESP no longer lists the stream as
balanced) starts over.  Fed with events and the time, unit-tested without a switch.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.rules.groups import Balanced

# (app, sender, stream)
Key = tuple[str, int, int]
LIVE = ("attached", "running")


def _first_version() -> int:
    # above the versions the core and the executor use, and never reused after a restart
    return (1 << 62) + int(time.time() * 1000)


@dataclass
class SenderSwitch:
    retry_s: float = 2.0
    # key -> ("sent", version, time) | ("done", version, time)
    switching: dict[Key, tuple[str, int, float]] = field(default_factory=dict)
    sent_versions: dict[int, Key] = field(default_factory=dict)
    versions: Iterable[int] = field(default_factory=lambda: itertools.count(_first_version()))

    def due(
        self,
        name: str,
        b: Balanced,
        statuses: Mapping[int, Any],
        holds_group: Callable[[str], bool],
        now: float,
    ) -> list[tuple[int, bool]]:
        """Senders of ``b`` to switch now, each with whether it is a retry.

        ``holds_group(host)``: that host's bridge holds the node's group."""
        out = []
        for u in b.senders:
            state = self.switching.get((name, u.worker_id, b.stream))
            if state is not None and (state[0] == "done" or now - state[2] < self.retry_s):
                continue
            status = statuses.get(u.worker_id)
            if status is None or status.state not in LIVE:
                continue
            if holds_group(u.host):
                out.append((u.worker_id, state is not None))
        return out

    def sent(self, key: Key, now: float) -> int:
        """A ROUTING for ``key`` is being sent: its version."""
        version = next(self.versions)
        self.sent_versions[version] = key
        self.switching[key] = ("sent", version, now)
        return version

    def on_ack(self, what: str, version: int, now: float) -> None:
        key = self.sent_versions.pop(version, None)
        if what == "ROUTING" and key is not None and key in self.switching:
            self.switching[key] = ("done", version, now)

    def on_metrics(self, app: str, wid: int, balanced: Mapping[str, Any], at: float) -> None:
        """A sender that reports a stream unbalanced after we switched it restarted (or
        someone else's ROUTING said so): switch it again."""
        for key, (state, _, since) in list(self.switching.items()):
            if key[:2] == (app, wid) and state == "done" and at > since + 1.0:
                if str(key[2]) not in balanced:
                    del self.switching[key]

    def on_worker_up(self, app: str, wid: int) -> None:
        """A restarted sender starts on worker addresses."""
        for key in [k for k in self.switching if k[:2] == (app, wid)]:
            del self.switching[key]

    def forget(self, app: str) -> None:
        for key in [k for k in self.switching if k[0] == app]:
            del self.switching[key]

    def switched(self) -> list[Key]:
        """Senders on the load-balancer address (to put back when the app stops)."""
        return [k for k, (state, _, _) in self.switching.items() if state == "done"]

    def report(self, app: str) -> dict[str, str]:
        """``"sender/stream": state`` of one application."""
        return {
            f"{wid}/{stream}": state
            for (a, wid, stream), (state, _, _) in sorted(self.switching.items())
            if a == app
        }
