"""``tests/midrun_kill.py`` (the mid-run SIGKILL of the tcp runtime and connector tests)
against a stand-in cluster in this process: it kills when the condition holds and not
before, records first, gives up or kills at its deadline as asked, and reads the
source's sent tuples and the newest complete checkpoint as the runs do."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from midrun_kill import (
    checkpointed,
    first_workers,
    run_killing,
    run_killing_after_commits,
    sent_by,
)


@dataclass
class Proc:
    signals: list[int] = field(default_factory=list)

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)


class Cluster:
    """``wait()`` lasts until every worker in ``until_killed`` got a signal (deadline 10 s)."""

    def __init__(self, until_killed: list[int]) -> None:
        workers = [SimpleNamespace(node="source", index=0, worker_id=1)]
        workers += [SimpleNamespace(node="count", index=i, worker_id=2 + i) for i in range(2)]
        self.physical = SimpleNamespace(
            workers=workers, of_node=lambda n: [w for w in workers if w.node == n]
        )
        self.procs = {w.worker_id: Proc() for w in workers}
        self.metrics: dict[int, dict] = {}
        self.until_killed = until_killed

    def wait(self) -> str:
        deadline = time.monotonic() + 10
        while not all(self.procs[w].signals for w in self.until_killed):
            assert time.monotonic() < deadline, "never killed"
            time.sleep(0.001)
        return "clean"


def test_kills_the_victims_once_ready_and_records_first():
    c = Cluster(until_killed=[2, 3])
    go = threading.Event()
    seen: list[list[int]] = []
    early: list[list[int]] = []

    def ready() -> bool:
        go.set()  # the killer is polling: now let the condition come true
        return c.metrics.get(1, {}).get("out", {}).get("default", 0) >= 10

    def feed() -> None:
        go.wait(5)
        early.extend(p.signals for p in c.procs.values() if p.signals)  # before the condition
        c.metrics[1] = {"out": {"default": 12, "0": 99}}

    feeder = threading.Thread(target=feed)
    feeder.start()
    victims = first_workers(c, ["count"]) + [3]
    got = run_killing(
        c, victims, ready, at_kill=lambda: seen.append([len(p.signals) for p in c.procs.values()])
    )
    feeder.join()
    assert got == "clean" and early == []
    assert seen == [[0, 0, 0]]  # at_kill ran before any signal
    assert c.procs[2].signals == [signal.SIGKILL] and c.procs[3].signals == [signal.SIGKILL]
    assert c.procs[1].signals == []


def test_at_the_deadline_it_kills_anyway_or_not_at_all():
    c = Cluster(until_killed=[2])
    assert run_killing(c, [2], lambda: False, deadline_s=0.05) == "clean"
    assert c.procs[2].signals == [signal.SIGKILL]

    c = Cluster(until_killed=[])
    recorded: list[int] = []
    run_killing(
        c,
        [2],
        lambda: False,
        deadline_s=0.05,
        kill_on_timeout=False,
        at_kill=lambda: recorded.append(1),
    )
    assert recorded == [] and c.procs[2].signals == []


def test_without_victims_it_only_waits():
    c = Cluster(until_killed=[])
    asked: list[int] = []
    assert run_killing(c, [], lambda: asked.append(1)) == "clean"
    assert asked == [] and all(p.signals == [] for p in c.procs.values())


def test_sent_by_counts_data_tuples_and_checkpointed_asks_for_every_worker():
    c = Cluster(until_killed=[])
    sent = sent_by(c)
    assert sent() == 0
    c.metrics[1] = {"out": {"default": 7, "late": 2, "0": 40}}  # stream 0: punctuation
    assert sent() == 9
    asked: list[set] = []

    class Store:
        def latest_complete(self, parts: set) -> int | None:
            asked.append(parts)
            return 4

    assert checkpointed(c, Store())() == 4
    assert asked == [{"source-0", "count-0", "count-1"}]


def test_after_commits_waits_for_a_checkpoint_the_sent_tuples_and_committed_rows():
    c = Cluster(until_killed=[2])
    state = {"epoch": None, "rows": 0}
    c.metrics[1] = {"out": {"default": 500}}
    asked = threading.Event()

    class Store:
        def latest_complete(self, parts: set) -> int | None:
            asked.set()
            return state["epoch"]

    def committed() -> int:
        return state["rows"]

    def feed() -> None:  # one condition after the other: the kill waits for all three
        asked.wait(5)
        state["epoch"] = 3
        c.metrics[1] = {"out": {"default": 1000}}
        early.extend(c.procs[2].signals)
        state["rows"] = 7

    early: list[int] = []
    feeder = threading.Thread(target=feed)
    feeder.start()
    at_kill: list[int] = []
    assert run_killing_after_commits(c, Store(), ["count"], 1000, committed, at_kill) == "clean"
    feeder.join()
    assert early == [] and at_kill == [7, 1000]
    assert c.procs[2].signals == [signal.SIGKILL] and c.procs[3].signals == []
