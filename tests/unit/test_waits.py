"""Tasks that wait on checks instead of sleeping (controller/waits.py)."""

from __future__ import annotations

from controller.waits import WAIT, Tasks


def test_a_task_runs_until_a_check_must_wait_and_resumes_with_its_answer():
    now = [0.0]
    tasks = Tasks(lambda: now[0])
    log: list[object] = []

    def until(t: float):
        return lambda clock: f"at {clock}" if clock >= t else WAIT

    def task():
        log.append("start")
        log.append((yield lambda clock: "at once"))  # answered without waiting
        log.append((yield until(2.0)))
        log.append((yield lambda clock: None))  # None is an answer, not a wait

    tasks.start(task(), log.append)
    assert log == ["start", "at once"] and len(tasks) == 1
    now[0] = 1.0
    tasks.advance()
    assert len(log) == 2
    now[0] = 2.5
    tasks.advance()
    assert log == ["start", "at once", "at 2.5", None] and len(tasks) == 0


def test_errors_end_the_task_and_go_to_its_owner():
    now = [0.0]
    tasks = Tasks(lambda: now[0])
    errors: list[Exception] = []

    def bad_check(clock):
        raise ValueError("check")

    def failing():
        yield bad_check

    def raising():
        yield lambda clock: WAIT if clock < 1.0 else "go"
        raise RuntimeError("body")

    tasks.start(failing(), errors.append)  # the first check raises at once
    tasks.start(raising(), errors.append)
    assert [str(e) for e in errors] == ["check"] and len(tasks) == 1
    now[0] = 1.0
    tasks.advance()
    assert [str(e) for e in errors] == ["check", "body"] and len(tasks) == 0
