"""How ovs-vswitchd's allocator must be set up for 64 KB worker ports.

Profiled with OVS 3.1 (docs/performance.md, "Where ovs-vswitchd's time went"): the
userspace datapath receives from a worker's TAP through a packet socket, and every
turn of its main loop allocates 32 receive buffers of the port's MTU for every port,
whether or not a frame is waiting, and frees the ones it did not fill.  At a 64,000-
byte MTU that is 2 MB per port per turn.  glibc hands the freed top of the heap back
to the kernel (its trim threshold is 128 KB), and ``--mlockall`` (``ovs-ctl``'s
default) makes every regrowth fault in and zero those pages at once: 77% of the
daemon's CPU went to ``brk``.  Keeping the heap (a trim threshold well above what
the buffers take, and some top padding) removes that; the setting is glibc's, read
from ``GLIBC_TUNABLES`` when the daemon starts, so it goes into the environment
``ovs-ctl start`` runs with (``scripts/setup.sh``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

# bytes; the buffers of ~100 64 KB ports (2 MB each per turn) stay under the threshold
TRIM_THRESHOLD = 256 * 1024 * 1024
TOP_PAD = 16 * 1024 * 1024
RUN_DIRS = ("/var/run/openvswitch", "/run/openvswitch")
TRIM_TUNABLE = "glibc.malloc.trim_threshold"


@dataclass(frozen=True)
class MallocTunables:
    """The glibc malloc settings ovs-vswitchd should start with."""

    trim_threshold: int = TRIM_THRESHOLD
    top_pad: int = TOP_PAD

    def env_value(self) -> str:
        """The value of ``GLIBC_TUNABLES``."""
        return f"{TRIM_TUNABLE}={self.trim_threshold}:glibc.malloc.top_pad={self.top_pad}"


def parse_tunables(value: str) -> dict[str, int]:
    """``a=1:b=2`` as a dict; entries that are not ``name=integer`` are left out."""
    out: dict[str, int] = {}
    for part in value.split(":"):
        name, sep, num = part.partition("=")
        if sep and name and num.isdigit():
            out[name] = int(num)
    return out


def problem(environ: bytes, wanted: MallocTunables = MallocTunables()) -> str | None:
    """What is missing from a daemon's environment (``/proc/PID/environ``), or None."""
    env = dict(entry.split(b"=", 1) for entry in environ.split(b"\0") if b"=" in entry)
    have = parse_tunables(env.get(b"GLIBC_TUNABLES", b"").decode(errors="replace"))
    # glibc 2.36 rewrites the variable in the process's environment after applying
    # it and only the first entry shows (``ld.so --list-tunables`` shows both
    # applied), so only the first, the trim threshold, can be checked
    if have.get(TRIM_TUNABLE, 0) >= wanted.trim_threshold:
        return None
    return (
        f"ovs-vswitchd runs without GLIBC_TUNABLES={wanted.env_value()} "
        f"({TRIM_TUNABLE} missing or lower): with 64 KB worker ports it spends most "
        "of its CPU regrowing its heap (docs/performance.md); restart it with "
        "scripts/setup.sh's start_ovs"
    )


def vswitchd_pid(run_dirs: tuple[str, ...] | None = None) -> int | None:
    """The running ovs-vswitchd's pid from its pidfile (``OVS_RUNDIR`` first), or None."""
    dirs = run_dirs if run_dirs is not None else _run_dirs()
    for d in dirs:
        try:
            return int((Path(d) / "ovs-vswitchd.pid").read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def _run_dirs() -> tuple[str, ...]:
    own = os.environ.get("OVS_RUNDIR")
    return (own, *RUN_DIRS) if own else RUN_DIRS


def running_problem() -> str | None:
    """:func:`problem` for the running daemon; None also when it cannot be read."""
    pid = vswitchd_pid()
    if pid is None:
        return None
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return problem(environ)


def main(argv: list[str] | None = None) -> int:
    """``python -m typhoon.ovs_malloc``: print the GLIBC_TUNABLES value (scripts/setup.sh);
    ``--check``: say whether the running daemon has it (exit 1 if not)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        found = running_problem()
        print(found or "ovs-vswitchd: malloc tunables set")
        return 1 if found else 0
    if args:
        print("usage: python -m typhoon.ovs_malloc [--check]", file=sys.stderr)
        return 2
    print(MallocTunables().env_value())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
