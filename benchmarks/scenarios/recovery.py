"""Scenario: recovery with each guarantee (issue 12; no figure in the paper).

The fault scenario's run (``benchmarks/scenarios/fault.py``: wordcount on 3
emulated hosts, a split worker SIGKILLed mid-run, port events) with the three
``guarantee`` settings side by side, interleaved over the rounds:

* **none**: the dead worker is routed around and replaced; what it held and
  what was in flight to it is lost (counted);
* **at least once**: the replacement starts from the last global checkpoint,
  every worker rolls back to it and the source replays; no word may be short;
* **exactly once**: the same with aligned checkpoints; every count must equal
  the reference.

Measured per guarantee: sentences lost, the count workers' input rate before
and after, the seconds below 80% of the pre-fault rate and kill -> back at
80%, and the throughput over time across the kill (``recovery.png``).

Then the size axis (``benchmarks/recovery_size.py``): 1, 2 and 4 independent
pipelines in one job, a worker of the first killed, partial against global
rollback: workers rolled back, recovery time, and the untouched pipelines' lowest
rate while pipeline 1 recovers (``recovery_size.png``).
"""

from __future__ import annotations

from benchmarks.fault_results import Medians
from benchmarks.recovery_size import SizeAxis
from benchmarks.scenario import Bench, Ratio, ScenarioResult, register
from benchmarks.scenarios.fault import Fault
from benchmarks.stats import ratio


@register
class Recovery(SizeAxis, Fault):
    name = "recovery"
    title = "Recovery: a killed worker under each guarantee"
    figure = "issue 12"
    order = 9

    variants = ("none", "at least once", "exactly once")
    plot_file = "recovery.png"
    plot_title = "Count workers' input around a killed split worker, per guarantee"
    comparison = (
        "'none' is the port-event failover without a guarantee; the other two restore the "
        "last global checkpoint (every 1 s) and replay. sdn only: the tcp runner recovers "
        "too (tests/runtime/test_tcp_runs.py) but has no fault detector to time."
    )

    def run(self, bench: Bench) -> ScenarioResult:
        res = super().run(bench)
        self.run_sizes(bench, res)
        return res

    def headline(
        self,
        lost: Medians,
        back: Medians,
        k2r: Medians,
        detect: Medians,
        after: Medians,
        before: Medians,
        below: Medians,
    ) -> list[Ratio]:
        out = []
        for v in ("at least once", "exactly once"):
            ok = None if lost[v] is None else lost[v] == 0
            out.append(Ratio(f"recovery: sentences lost, {v}", lost[v], "0", ok))
        out.append(Ratio("recovery: sentences lost, none", lost["none"]))
        for v in self.variants:
            out.append(Ratio(f"recovery: seconds below 80% of the pre-fault rate, {v}", below[v]))
            out.append(Ratio(f"recovery: kill -> count rate back at 80%, {v} (s)", back[v]))
        out.append(
            Ratio(
                "recovery: pre-fault count rate, exactly once / none",
                ratio(before["exactly once"], before["none"]),
            )
        )
        return out
