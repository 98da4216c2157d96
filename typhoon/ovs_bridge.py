"""A host's Open vSwitch bridge as the agent changes it: worker ports in and out.

Only through ``ovs-vsctl`` argument lists (no shell); a failed or hung command
is an :class:`OvsError` with what OVS said.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass


class OvsError(RuntimeError):
    """An ovs-vsctl command failed."""


@dataclass
class Bridge:
    """The host's OVS bridge, changed only through ovs-vsctl argument lists."""

    name: str
    timeout: float = 10.0

    def _vsctl(self, *args: str) -> str:
        cmd = ["ovs-vsctl", f"--timeout={int(self.timeout)}", *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout + 5)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise OvsError(f"{' '.join(cmd)}: {e}") from e
        if proc.returncode != 0:
            raise OvsError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def attach(self, tap: str, ofport: int) -> int | None:
        """Add ``tap`` at ``ofport``; return the port OVS actually gave it."""
        self._vsctl(
            "--may-exist", "add-port", self.name, tap,
            "--", "set", "Interface", tap, f"ofport_request={ofport}",
        )  # fmt: skip
        return self.ofport(tap)

    def ofport(self, tap: str) -> int | None:
        value = self._vsctl("get", "Interface", tap, "ofport")
        try:
            port = int(value)
        except ValueError:
            return None  # "[]": not assigned yet
        return port if port > 0 else None

    def detach(self, tap: str) -> None:
        self._vsctl("--if-exists", "del-port", self.name, tap)
