"""What the numbers were measured on: results mean little without the machine.

Load averages are recorded at the start and at the end, because this
machine is shared: a high load says the numbers carry other people's noise.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from controller.framework import backend
from typhoon import ovs_malloc


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.splitlines()[0].strip() if out.strip() else "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _controller_backend() -> str:
    """The framework the runs' controller uses (controller/framework/backend.py)."""
    try:
        return backend.selected()
    except backend.BackendError as e:
        return str(e)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def describe() -> dict[str, Any]:
    """Cores, memory, OS, kernel, and the versions of what the runs depend on."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "os": _os_name(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "openvswitch": _first_line(["ovs-vswitchd", "--version"]),
        "ovs_datapath": "userspace (netdev)",
        "ovs_malloc": ovs_malloc.running_problem() or "GLIBC_TUNABLES set (typhoon/ovs_malloc.py)",
        "mininet": _version("mininet"),
        "ryu": _version("ryu"),
        "os_ken": _version("os-ken"),
        "controller_backend": _controller_backend(),
        "msgpack": _version("msgpack"),
        "matplotlib": _version("matplotlib"),
        "bytewax": _version("bytewax"),  # the ``peers`` scenario's comparison (extra ``bench``)
        "load_average_start": load_average(),
    }
