"""One run of the locality router on one application, advanced by the app's timer.

``collecting`` (fresh METRIC_RESPs from the counting node's workers) ->
``routing`` (the two ``direct`` reroutes, one after the other, each a stable
update of ``controller/reconfigure.py``) -> ``measuring`` (the counters at
the switch, the baseline of "after") -> ``done``; or ``skipped`` (too few
pairs, or a periodic run whose plan would not gain enough) or ``failed``.
Every transition happens in :meth:`LocalityJob.step`, called on the app's
event loop with the controller core's services, so nothing here blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from controller.locality.router import (
    Chain,
    LocalityError,
    compute_plan,
    crossing,
    find_chain,
    merged_pairs,
    minus,
    plan_summary,
    reroutes,
    sent_links,
)
from controller.settings import setting
from typhoon.reconfig import ReconfigError, Reroute

FRESH_WAIT_S = 10.0  # longest wait for the METRIC_RESPs asked for
ASK_AGAIN_S = 1.0  # a METRIC_REQ or its answer lost on the way (both are one frame
# through packet-out/packet-in, unacknowledged): asked again this often while waiting


@dataclass(frozen=True)
class RouterSettings:
    """The ``[locality]`` section (``controller/settings.py``)."""

    section: ClassVar[str] = "locality"

    interval_s: float = setting(
        0.0, "seconds between periodic runs (0: only on request)", name="interval"
    )
    imbalance: float = setting(1.03, "most key load per host over its fair share (METIS)")
    min_pairs: int = setting(1000, "sampled pairs needed before planning")
    min_gain: float = setting(0.05, "local pair weight a periodic run must gain to apply")
    timeout_s: float = setting(
        120.0, "seconds before a run that has not finished fails", name="timeout"
    )


class Core(Protocol):
    """What a job asks of the controller (``controller/services.py``)."""

    view: Any

    def request_metrics(self, app: str, worker_ids: Any = None) -> int: ...

    def worker_metrics(self, app: str) -> dict[int, dict]: ...

    def reconfigure(self, app: str, request: Any) -> Any: ...

    def reconfiguration(self, app: str) -> Any: ...


def periodic_due(
    settings: RouterSettings,
    last: LocalityJob | None,
    counts_pairs: bool,
    active: bool,
    updating: bool,
    now: float,
) -> bool:
    """A periodic run is due: periodic runs are on, the application counts pairs and
    runs, no update of it is under way, and the last run ended ``interval`` ago."""
    if settings.interval_s <= 0 or not counts_pairs or not active or updating:
        return False
    return last is None or (not last.running and now - last.finished >= settings.interval_s)


@dataclass
class LocalityJob:
    app: str
    auto: bool
    settings: RouterSettings
    started: float
    phase: str = "collecting"
    reason: str = ""
    chain: Chain | None = None
    asked: dict[int, Any] = field(default_factory=dict)  # worker -> metrics time before asking
    asked_at: float = 0.0
    last_ask: float = 0.0
    requests: int = 0  # METRIC_REQs sent to each worker not yet heard from, this round
    summary: dict[str, Any] = field(default_factory=dict)
    pending: list[Reroute] = field(default_factory=list)
    reconfigs: list[int] = field(default_factory=list)
    before: dict[tuple[int, int], int] = field(default_factory=dict)
    after_base: dict[tuple[int, int], int] | None = None
    finished: float = 0.0

    @property
    def running(self) -> bool:
        return self.phase in ("collecting", "routing", "measuring")

    def begin(self, core: Core, now: float) -> None:
        """Find the chain and ask its workers for fresh statistics (LocalityError if none)."""
        view = core.view.apps.get(self.app)
        if view is None:
            raise LocalityError(f"no application named '{self.app}'", 404)
        self.chain = find_chain(view.topology)
        self._ask(core, view, now)

    def step(self, core: Core, now: float) -> None:
        if not self.running:
            return
        view = core.view.apps.get(self.app)
        if view is None:
            return self._end("failed", "the application is gone", now)
        if now - self.started > self.settings.timeout_s:
            return self._end("failed", f"not finished after {self.settings.timeout_s:g} s", now)
        try:
            if self.phase == "collecting" and self._fresh(core, view, now):
                self._plan(core, view, now)
            elif self.phase == "routing":
                self._route(core, now)
            elif self.phase == "measuring" and self._fresh(core, view, now):
                assert self.chain is not None
                self.after_base = sent_links(self._metrics(core, view), self.chain.stream_out.id)
                self._end("done", "", now)
        except (LocalityError, ReconfigError) as e:
            self._end("failed", e.message, now)

    # ----- phases ----------------------------------------------------------------------------

    def _workers(self, view: Any) -> list[int]:
        assert self.chain is not None
        return [w.worker_id for w in view.physical.active_of_node(self.chain.node)]

    def _metrics(self, core: Core, view: Any) -> dict[int, dict]:
        got = core.worker_metrics(self.app)
        return {w: got[w] for w in self._workers(view) if w in got}

    def _ask(self, core: Core, view: Any, now: float) -> None:
        ids = self._workers(view)
        known = core.worker_metrics(self.app)
        self.asked = {w: known.get(w, {}).get("time") for w in ids}
        self.asked_at = self.last_ask = now
        self.requests = 1
        core.request_metrics(self.app, ids)

    def _fresh(self, core: Core, view: Any, now: float) -> bool:
        """Every worker asked answered since (or the wait is over and each has said something)."""
        got = core.worker_metrics(self.app)
        waiting = [w for w, t in self.asked.items() if w not in got or got[w].get("time") == t]
        if not waiting:
            return True
        if now - self.asked_at < FRESH_WAIT_S:
            if now - self.last_ask >= ASK_AGAIN_S:
                self.last_ask = now
                self.requests += 1
                core.request_metrics(self.app, waiting)
            return False
        silent = [w for w in waiting if w not in got]
        if not silent:
            return True  # each has answered once: plan with what they said last
        raise LocalityError(
            f"worker(s) {', '.join(map(str, silent))} of '{self.chain.node if self.chain else '?'}'"
            f" did not answer any of {self.requests} METRIC_REQs in {FRESH_WAIT_S:g} s"
        )

    def _plan(self, core: Core, view: Any, now: float) -> None:
        assert self.chain is not None
        metrics = self._metrics(core, view)
        pairs = merged_pairs(metrics.values())
        weight = sum(pairs.values())
        if weight < self.settings.min_pairs:
            return self._end(
                "skipped", f"{weight} sampled pairs, fewer than min_pairs "
                f"{self.settings.min_pairs}", now,
            )  # fmt: skip
        plan = compute_plan(view.topology, view.physical, self.chain, pairs,
                            self.settings.imbalance)  # fmt: skip
        self.summary = plan_summary(plan, pairs)
        gain = plan.local_fraction - plan.hash_local_fraction
        if self.auto and gain < self.settings.min_gain:
            return self._end("skipped", f"the plan would gain {gain:.3f} of local pair weight, "
                             f"less than min_gain {self.settings.min_gain}", now)  # fmt: skip
        self.before = sent_links(metrics, self.chain.stream_out.id)
        self.pending = reroutes(self.chain, plan)
        if not self.pending:
            return self._end("skipped", "both streams already route by these tables", now)
        self.phase = "routing"
        self._next_reroute(core)

    def _next_reroute(self, core: Core) -> None:
        record = core.reconfigure(self.app, self.pending.pop(0))
        self.reconfigs.append(record.id)

    def _route(self, core: Core, now: float) -> None:
        record = core.reconfiguration(self.app)
        if record is None or record.id != self.reconfigs[-1]:
            return self._end("failed", "the reroute's record is gone", now)
        if record.running:
            return None
        if record.state != "done":
            return self._end(
                "failed", f"reconfiguration {record.id} {record.state}: {record.error}", now
            )
        if self.pending:
            return self._next_reroute(core)
        self.phase = "measuring"
        self._ask(core, core.view.apps[self.app], now)
        return None

    def _end(self, phase: str, reason: str, now: float) -> None:
        self.phase, self.reason, self.finished = phase, reason, now

    # ----- report ----------------------------------------------------------------------------

    def report(self, core: Core) -> dict[str, Any]:
        """The plan, and the measured fraction of A -> B tuples crossing hosts before the
        switch (since the start) and after it (since the switch finished)."""
        out: dict[str, Any] = {
            "phase": self.phase,
            "reason": self.reason,
            "auto": self.auto,
            "node": self.chain.node if self.chain else None,
            "streams": [self.chain.stream_in.id, self.chain.stream_out.id] if self.chain else [],
            "plan": self.summary,
            "reconfigurations": list(self.reconfigs),
            "seconds": round((self.finished or self.started) - self.started, 3),
        }
        view = core.view.apps.get(self.app)
        if view is None or self.chain is None:
            return out
        physical = view.physical
        measured: dict[str, Any] = {}
        if self.before:
            measured["before"] = crossing(self.before, physical).to_dict()
        if self.after_base is not None:
            now = sent_links(self._metrics(core, view), self.chain.stream_out.id)
            measured["after"] = crossing(minus(now, self.after_base), physical).to_dict()
        out["crossing"] = measured
        return out
