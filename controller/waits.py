"""Sequential control-plane work that waits, without threads or sleeps.

A task is a generator: it acts, then yields a *check* (``now -> result``, or
:data:`WAIT` to keep waiting) and is resumed with the result once the check
gives one.  :class:`Tasks` evaluates the checks whenever the app that owns it
is told to (a timer event, ``controller/app_support.py``), so every state
change happens on the app's one event loop, and a test drives the same code
with a fake clock.  A check holds its own deadline and answers with what a
timeout means.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

WAIT: Any = object()  # a check's answer: not yet

Check = Callable[[float], Any]
Task = Generator[Check, Any, None]


@dataclass
class _Running:
    gen: Task
    on_error: Callable[[Exception], None]
    check: Check | None = None


class Tasks:
    """The tasks that wait, and the clock their checks are asked with."""

    def __init__(self, clock: Callable[[], float], logger: logging.Logger | None = None) -> None:
        self.clock = clock
        self.logger = logger or logging.getLogger(__name__)
        self.waiting: list[_Running] = []

    def start(self, gen: Task, on_error: Callable[[Exception], None]) -> None:
        """Run ``gen`` up to its first check that must wait (possibly to its end)."""
        self._resume(_Running(gen, on_error), None)

    def advance(self) -> None:
        """Ask every waiting task's check once; resume those that have their answer."""
        waiting, self.waiting = self.waiting, []
        for task in waiting:
            try:
                value = task.check(self.clock())
            except Exception as e:  # a bug in a check ends its task, reported
                task.on_error(e)
                continue
            if value is WAIT:
                self.waiting.append(task)
            else:
                self._resume(task, value)

    def _resume(self, task: _Running, value: Any) -> None:
        while True:
            try:
                check = task.gen.send(value)
                value = check(self.clock())
            except StopIteration:
                return
            except Exception as e:  # report it through the task's owner, never raise
                task.on_error(e)
                return
            if value is WAIT:
                task.check = check
                self.waiting.append(task)
                return

    def __len__(self) -> int:
        return len(self.waiting)
