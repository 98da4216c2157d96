"""Hosts whose switch is not connected when the core sends to them, said once, calmly.

After a controller restart the coordinator's applications are known at once,
while the switches reconnect over the next seconds; every control tuple and
metrics round meanwhile finds no switch for some host.  That is expected, not
an error: one info line per host until its switch connects, instead of a
warning per worker per round.
"""

from __future__ import annotations


class AbsentSwitches:
    def __init__(self) -> None:
        self.noted: set[str] = set()

    def note(self, host: str) -> str | None:
        """The line to log the first time ``host`` is found without a switch, else None."""
        if host in self.noted:
            return None
        self.noted.add(host)
        return (
            f"no switch connected for host {host} yet (switches reconnect after a controller "
            "restart): control tuples to its workers wait until it does"
        )

    def connected(self, host: str | None) -> None:
        """``host``'s switch connected: a later absence is news again."""
        self.noted.discard(host or "")
