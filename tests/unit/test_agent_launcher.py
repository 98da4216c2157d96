"""How an agent starts a worker (typhoon.agent_launcher, typhoon.zygote.ZygoteLauncher with
an agent's settings): a worker command is forked by the zygote while it is usable, with
its log appended to and signals through its pidfd; anything else, or any worker once the
zygote is unusable, is spawned in a session of its own (one log line saying why).  A
detached zygote's child that ended after the zygote died ended with no code to know."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from typhoon.agent_launcher import agent_zygote, spawn
from typhoon.supervised import Supervised
from typhoon.zygote import ForkJob, ZygoteChild, ZygoteLauncher

WORKER = [sys.executable, "-m", "typhoon.runtime.worker"]


class FakeZygote:
    """Stands for typhoon.zygote.Zygote: forks by recording the request."""

    def __init__(self, why: str | None = None) -> None:
        self.why = why
        self.forks: list[list[str]] = []
        self.jobs: list[ForkJob] = []
        self.closed = False

    def usable(self) -> str | None:
        return self.why

    def fork(self, job: ForkJob, log_fd: int) -> ZygoteChild:
        os.write(log_fd, b"forked\n")
        self.forks.append(list(job.specs))
        self.jobs.append(job)
        return ZygoteChild(self, os.getpid())  # type: ignore[arg-type]

    def pump(self, timeout: float) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def launcher(zygote: FakeZygote) -> ZygoteLauncher:
    return ZygoteLauncher(zygote, append=True, own_session=True)  # type: ignore[arg-type]


def test_a_worker_is_forked_with_its_log_appended_and_signalled_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "worker-3.log"
    log.write_text("the first launch\n")
    z = FakeZygote()
    start = launcher(z)
    proc = start("h1", [*WORKER, "app/worker-3.spec.json", "app/worker-4.spec.json"], log)
    try:
        assert z.forks == [[f"{tmp_path}/app/worker-3.spec.json",
                            f"{tmp_path}/app/worker-4.spec.json"]]  # fmt: skip
        assert isinstance(proc.proc, ZygoteChild) and proc.name == "worker-3"
        assert not proc.own_session  # a group signal would be a killpg of a pid it may reuse
        assert (start.forked, start.spawned) == (1, 0)
    finally:
        proc.close_log()
        proc.proc.ended(0)  # type: ignore[union-attr]
    assert log.read_text() == "the first launch\nforked\n"


def test_anything_else_or_any_worker_once_the_zygote_is_unusable_is_spawned_on_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "typhoon.zygote")
    z = FakeZygote(why="the zygote is gone (it exited with -9)")
    start = launcher(z)
    log = tmp_path / "worker-5.log"
    log.write_text("before\n")
    procs: list[Supervised] = []
    try:
        procs.append(start("h1", [sys.executable, "-c", "print('custom')"], log))
        for _ in range(2):
            procs.append(start("h1", [*WORKER, str(tmp_path / "worker-5.spec.json")], log))
        for p in procs:
            assert p.own_session and p.wait(30) is not None
        assert z.forks == [] and (start.forked, start.spawned) == (0, 2)
        assert caplog.text.count("worker-5: spawned, not forked: the zygote is gone") == 1
        text = log.read_text()
        assert text.startswith("before\ncustom\n") and "FileNotFoundError" in text  # appended
    finally:
        for p in procs:
            p.close_log()
    start.close()
    assert z.closed


def test_a_detached_child_that_ended_after_its_zygote_has_no_code(tmp_path: Path) -> None:
    child = ZygoteChild(FakeZygote(), os.getpid())  # type: ignore[arg-type]
    supervised = Supervised("worker-1", child, log=tmp_path / "w.log")
    assert supervised.exit_status() == (False, None)
    child.ended(None)  # what typhoon.zygote.Zygote does once a detached zygote is gone
    assert child.code_lost and child.pidfd is None
    assert supervised.exit_status() == (True, None)
    assert supervised.wait(0.1) is None  # returns at once: nothing more will come
    child.ended(-9)  # a late report changes nothing
    assert supervised.exit_status() == (True, None)


def test_spawn_starts_a_worker_in_a_session_of_its_own(tmp_path: Path) -> None:
    proc = spawn("h1", [sys.executable, "-c", "import os; print(os.getsid(0))"], tmp_path / "w.log")
    try:
        assert proc.wait(30) == 0
    finally:
        proc.close_log()
    assert proc.name == "w" and int((tmp_path / "w.log").read_text()) == proc.pid


def test_no_zygote_under_a_work_directory_whose_path_holds_a_space(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "typhoon.agent")
    assert agent_zygote(tmp_path / "my work", "h1") is None  # no process was started
    assert "path holds a space" in caplog.text
    assert not (tmp_path / "my work").exists()
