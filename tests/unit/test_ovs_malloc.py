"""ovs-vswitchd's malloc settings: the GLIBC_TUNABLES value, the check of a running
daemon's environment, and that scripts/setup.sh starts OVS with them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from typhoon import ovs_malloc
from typhoon.ovs_malloc import MallocTunables, parse_tunables, problem, vswitchd_pid

ROOT = Path(__file__).resolve().parents[2]


def _environ(**env: str) -> bytes:
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())


def test_value_names_both_settings_trim_threshold_first() -> None:
    value = MallocTunables().env_value()
    assert value == "glibc.malloc.trim_threshold=268435456:glibc.malloc.top_pad=16777216"
    assert parse_tunables(value) == {
        "glibc.malloc.trim_threshold": ovs_malloc.TRIM_THRESHOLD,
        "glibc.malloc.top_pad": ovs_malloc.TOP_PAD,
    }


def test_threshold_above_the_receive_buffers_of_many_64k_ports() -> None:
    # 32 buffers of a 64,000-byte MTU per port per loop turn
    per_port = 32 * 64_000
    assert ovs_malloc.TRIM_THRESHOLD > 100 * per_port


def test_parse_leaves_out_malformed_entries() -> None:
    assert parse_tunables("a=1:b:=3:c=x:d=4::") == {"a": 1, "d": 4}


def test_daemon_without_the_variable_is_a_problem() -> None:
    found = problem(_environ(HOME="/root", PATH="/usr/bin"))
    assert found is not None and "GLIBC_TUNABLES=" in found and "trim_threshold" in found


def test_lower_threshold_is_a_problem() -> None:
    assert problem(_environ(GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")) is not None


def test_full_value_is_fine() -> None:
    assert problem(_environ(GLIBC_TUNABLES=MallocTunables().env_value())) is None


def test_environment_as_glibc_236_leaves_it_is_fine() -> None:
    # only the first entry is left in /proc/PID/environ after glibc applied both
    assert problem(_environ(GLIBC_TUNABLES="glibc.malloc.trim_threshold=268435456")) is None


def test_garbage_environment_is_a_problem_not_a_crash() -> None:
    assert problem(b"\xff\xfe\0GLIBC_TUNABLES=\xff=\x00\0noequals\0") is not None


def test_pid_from_the_first_readable_pidfile(tmp_path: Path) -> None:
    missing, bad, good = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    bad.mkdir()
    good.mkdir()
    (bad / "ovs-vswitchd.pid").write_text("not a pid\n")
    (good / "ovs-vswitchd.pid").write_text("4242\n")
    assert vswitchd_pid((str(missing), str(bad), str(good))) == 4242
    assert vswitchd_pid((str(missing),)) is None


def test_ovs_rundir_is_looked_at_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ovs-vswitchd.pid").write_text("77\n")
    monkeypatch.setenv("OVS_RUNDIR", str(tmp_path))
    assert vswitchd_pid() == 77


def test_main_prints_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert ovs_malloc.main([]) == 0
    assert capsys.readouterr().out.strip() == MallocTunables().env_value()
    assert ovs_malloc.main(["--bogus"]) == 2


def test_setup_script_starts_ovs_with_the_value() -> None:
    script = (ROOT / "scripts" / "setup.sh").read_text()
    start = [line for line in script.splitlines() if '"$OVS_CTL" start' in line]
    assert len(start) == 1
    assert re.search(r'GLIBC_TUNABLES="\$\("\$VENV/bin/python" -m typhoon\.ovs_malloc\)"', start[0])
