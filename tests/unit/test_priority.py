"""Work run nicer, then back (typhoon.priority): only where the nice value can go back,
since a zygote left nicer would hand its priority to every worker it forks."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from typhoon import priority
from typhoon.priority import may_renice_to, nicer


def status(tmp_path: Path, cap_eff: int) -> Path:
    path = tmp_path / "status"
    path.write_text(f"Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff:016x}\n")
    return path


def no_rlimit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (0, 0))  # RLIMIT_NICE 0: none


def test_going_back_needs_cap_sys_nice_or_a_nice_rlimit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_rlimit(monkeypatch)
    assert may_renice_to(0, status(tmp_path, 1 << 23))  # CAP_SYS_NICE
    assert not may_renice_to(0, status(tmp_path, (1 << 12) | (1 << 24)))  # others only
    assert not may_renice_to(0, tmp_path / "missing")
    (tmp_path / "garbled").write_text("CapEff:\tzz\n")
    assert not may_renice_to(0, tmp_path / "garbled")
    monkeypatch.setattr(resource, "getrlimit", lambda _: (20, 20))  # down to nice 0
    assert may_renice_to(0, tmp_path / "missing")
    assert not may_renice_to(-1, tmp_path / "missing")


def test_nicer_runs_the_block_nicer_and_goes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    now = [0]
    monkeypatch.setattr(os, "getpriority", lambda *_: now[0])

    def setpriority(_which: int, _who: int, n: int) -> None:
        calls.append(n)
        now[0] = n

    monkeypatch.setattr(os, "setpriority", setpriority)
    monkeypatch.setattr(priority, "may_renice_to", lambda _n: True)
    with nicer(10) as applied:
        assert applied and now[0] == 10
    assert calls == [10, 0]
    now[0] = 15
    with nicer(10):
        assert now[0] == 19  # capped
    assert now[0] == 15
    with pytest.raises(KeyError), nicer(3):
        raise KeyError("the block failed")
    assert now[0] == 15  # back anyway


def test_nicer_leaves_the_priority_alone_when_it_could_not_go_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "setpriority", lambda *_: pytest.fail("reniced"))
    monkeypatch.setattr(priority, "may_renice_to", lambda _n: False)
    with nicer(10) as applied:
        assert not applied
    monkeypatch.setattr(priority, "may_renice_to", lambda _n: True)
    with nicer(0) as applied:
        assert not applied


def test_nicer_for_real_in_this_process_if_allowed() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    with nicer(5) as applied:
        inside = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, 0) == base
    assert inside == (min(19, base + 5) if applied else base)
    assert applied == (base < 19 and may_renice_to(base))
