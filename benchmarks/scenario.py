"""What a benchmark scenario is, the registry of them, and what every scenario gets to run.

A scenario is one module in ``benchmarks/scenarios/`` with one
:class:`Scenario` subclass decorated with :func:`register`; nothing else
names it, so adding the paper's next figure is adding one file.  It receives
a :class:`Bench` (the testbed, the output directory, quick or full mode) and
returns a :class:`ScenarioResult`: tables for ``results.md``, headline
ratios with their targets, the PNG files it drew, and every run's record for
``results.json``.

The machine this runs on has two cores and other work on it, so numbers move
from run to run by more than the effects measured.  :meth:`Bench.interleaved`
therefore runs the two transports side by side, alternating which goes first,
repeated over rounds, and scenarios report medians and ratios of medians.
"""

from __future__ import annotations

import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TextIO, TypeVar

from benchmarks.testbed import TRANSPORTS, RunResult, RunSpec, Testbed

P = TypeVar("P", bound=Hashable)


# ----- results ------------------------------------------------------------------------------


@dataclass
class Table:
    """One Markdown table: cells are already formatted text."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class Ratio:
    """A headline number: what it is, its value, and the target it is held against."""

    name: str
    value: float | None
    target: str = ""  # e.g. ">= 1.0"
    met: bool | None = None  # None: no target, or no value

    @classmethod
    def against(cls, name: str, value: float | None, at_least: float | None = None) -> Ratio:
        if at_least is None:
            return cls(name, value)
        met = None if value is None else value >= at_least
        return cls(name, value, f">= {at_least:g}", met)


@dataclass
class ScenarioResult:
    """Everything a scenario hands back to the runner."""

    name: str
    title: str
    figure: str
    mode: str  # "quick" | "full"
    started: str = ""  # local date and time the scenario began
    load: list[float] = field(default_factory=list)  # 1-min load average at start and end
    tables: list[Table] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)  # PNG file names in the output directory
    notes: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)  # numbers behind the tables
    runs: list[dict[str, Any]] = field(default_factory=list)  # every run's record
    failures: int = 0
    elapsed_s: float = 0.0
    error: str = ""  # the scenario itself broke (not one run)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScenarioResult:
        d = dict(d)
        d["tables"] = [Table(**t) for t in d.get("tables", [])]
        d["ratios"] = [Ratio(**r) for r in d.get("ratios", [])]
        return cls(**d)


# ----- the context scenarios run in ---------------------------------------------------------


@dataclass
class Bench:
    """What a scenario runs with: the testbed, where its files go, and the mode."""

    testbed: Testbed
    out_dir: Path
    quick: bool
    repeats: int
    out: TextIO = sys.stderr
    records: list[dict[str, Any]] = field(default_factory=list)
    failures: int = 0

    @property
    def mode(self) -> str:
        return "quick" if self.quick else "full"

    def run(self, spec: RunSpec, check: Callable[[RunResult], None] | None = None) -> RunResult:
        """One run, its record kept for ``results.json`` and a progress line printed;
        ``check`` may fail an ok run (e.g. counts that differ) before it is recorded."""
        result = self.testbed.run(spec)
        if check is not None and result.ok:
            check(result)
        self.record(result.to_dict(), result.ok)
        status = "ok" if result.ok else f"FAILED: {result.error}"
        print(
            f"  {spec.label or spec.topology.name} [{spec.transport}]: {status} "
            f"({result.wall_s:.1f} s)",
            file=self.out,
            flush=True,
        )
        return result

    def record(self, record: dict[str, Any], ok: bool) -> None:
        """Keep a run's record for ``results.json`` (also a run of another system, which
        has ``label``, ``transport`` naming the system, ``ok`` and ``error`` too)."""
        self.records.append(record)
        if not ok:
            self.failures += 1

    def interleaved(
        self,
        points: Sequence[P],
        make_spec: Callable[[P, str], RunSpec],
        repeats: int | None = None,
    ) -> dict[tuple[P, str], list[RunResult]]:
        """Every point on both transports, ``repeats`` rounds (default: the bench's);
        in each round the two transports run back to back (sdn first in even
        rounds, tcp first in odd ones), so slow drift and neighbours' load hit
        both alike."""
        results: dict[tuple[P, str], list[RunResult]] = {
            (p, t): [] for p in points for t in TRANSPORTS
        }
        for rnd in range(self.repeats if repeats is None else repeats):
            order = TRANSPORTS if rnd % 2 == 0 else TRANSPORTS[::-1]
            for p in points:
                for t in order:
                    results[(p, t)].append(self.run(make_spec(p, t)))
        return results

    def take_records(self) -> tuple[list[dict[str, Any]], int]:
        records, failures = self.records, self.failures
        self.records, self.failures = [], 0
        return records, failures


class Scenario(ABC):
    """A paper experiment; subclasses set the class attributes and implement ``run``."""

    name: ClassVar[str]  # CLI name: ``typhoon bench --only NAME``
    title: ClassVar[str]
    figure: ClassVar[str]  # the paper's figure, e.g. "Fig. 9"
    order: ClassVar[int]  # position in the suite and in results.md

    @abstractmethod
    def run(self, bench: Bench) -> ScenarioResult:
        """Run the experiment on ``bench`` and describe what it measured."""

    def result(self, bench: Bench) -> ScenarioResult:
        """An empty result of this scenario, for ``run`` to fill."""
        return ScenarioResult(self.name, self.title, self.figure, bench.mode)


_REGISTRY: dict[str, type[Scenario]] = {}


def register(cls: type[Scenario]) -> type[Scenario]:
    """Class decorator: make a scenario known to ``typhoon bench``."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"two scenarios are named '{cls.name}'")
    _REGISTRY[cls.name] = cls
    return cls


def scenarios() -> list[type[Scenario]]:
    """Every registered scenario (importing ``benchmarks.scenarios`` first), in suite order."""
    from benchmarks.scenarios import discover

    discover()
    return sorted(_REGISTRY.values(), key=lambda c: (c.order, c.name))


def run_scenario(scenario: Scenario, bench: Bench) -> ScenarioResult:
    """Run one scenario; an exception becomes a failed result instead of ending the suite."""
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load = os.getloadavg()[0]
    try:
        result = scenario.run(bench)
    except Exception as e:
        result = scenario.result(bench)
        result.error = f"{type(e).__name__}: {e}"
    result.started = started
    result.load = [round(load, 2), round(os.getloadavg()[0], 2)]
    result.runs, result.failures = bench.take_records()
    if result.error:
        result.failures += 1
    result.elapsed_s = round(time.monotonic() - t0, 1)
    return result
