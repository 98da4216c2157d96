"""SIGKILL workers of a running ``TcpCluster`` mid-run: at a condition, never after a sleep.

The runtime and connector tests on ``tcp`` kill workers once a run is far enough
along (a source sent so many tuples, a global checkpoint is complete, rows are
committed) and then check what the recovery made of it.  ``run_killing`` runs the
cluster to its end while a thread waits for the condition and kills; ``sent_by``
and ``checkpointed`` read the usual parts of such conditions;
``kill_once_checkpointed`` is the whole exactly-once set-up the wordcount kill tests
share (a plain and a chained wordcount).  Tests import it as
``from midrun_kill import ...`` (``tests/`` is on ``sys.path``, as for ``dbservers``).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typhoon.live import data_tuples


def sent_by(cluster: Any, node: str = "source") -> Callable[[], int]:
    """Data tuples the first worker of ``node`` has sent so far, from its METRIC_RESPs
    (``cluster.wait()`` asks for them)."""
    wid = cluster.physical.of_node(node)[0].worker_id
    return lambda: data_tuples(cluster.metrics.get(wid, {}).get("out", {}))


def checkpointed(cluster: Any, store: Any) -> Callable[[], int | None]:
    """The newest global checkpoint ``store`` holds complete for every worker of the
    run (None before there is one)."""
    parts = {f"{w.node}-{w.index}" for w in cluster.physical.workers}
    return lambda: store.latest_complete(parts)


def first_workers(cluster: Any, nodes: Iterable[str]) -> list[str]:
    """The worker id of each node's first worker."""
    return [cluster.physical.of_node(n)[0].worker_id for n in nodes]


def run_killing(
    cluster: Any,
    victims: Iterable[str],
    ready: Callable[[], Any],
    *,
    deadline_s: float = 60.0,
    kill_on_timeout: bool = True,
    at_kill: Callable[[], None] | None = None,
    poll_s: float = 0.01,
) -> Any:
    """``cluster.wait()`` while a thread SIGKILLs the worker ids ``victims`` once
    ``ready()`` is true (polled every ``poll_s``); returns what ``wait()`` does.

    If ``ready()`` stays false for ``deadline_s`` the victims are killed then
    anyway (``kill_on_timeout``) or not at all; either way the test's own
    assertions must say so (what ``at_kill`` recorded, ``cluster.recovered``).
    ``at_kill()`` runs right before the kill, to record what was there then.
    Without victims it is just the wait.
    """
    victims = list(victims)
    if not victims:
        return cluster.wait()

    def kill() -> None:
        deadline = time.monotonic() + deadline_s
        while not ready():
            if time.monotonic() > deadline:
                if not kill_on_timeout:
                    return
                break
            time.sleep(poll_s)
        if at_kill is not None:
            at_kill()
        for wid in victims:
            cluster.procs[wid].send_signal(signal.SIGKILL)

    killer = threading.Thread(target=kill)
    killer.start()
    clean = cluster.wait()
    killer.join()
    return clean


def run_killing_after_commits(
    cluster: Any,
    store: Any,
    victims: Iterable[str],
    sent_at_least: int,
    committed: Callable[[], int],
    at_kill: list[int],
) -> Any:
    """``run_killing`` as the sink tests want it: the first workers of the nodes
    ``victims`` die once a global checkpoint is complete in ``store``, the source sent
    ``sent_at_least`` tuples and the sink committed rows (``committed()``, a count, is
    above 0).  ``at_kill`` then gets the rows committed and the tuples sent; it stays
    empty if that never happened within 60 s (nothing is killed then)."""
    done, sent = checkpointed(cluster, store), sent_by(cluster)

    def record() -> None:
        at_kill.extend([committed(), sent()])

    return run_killing(
        cluster,
        first_workers(cluster, victims),
        lambda: done() is not None and sent() >= sent_at_least and committed() > 0,
        kill_on_timeout=False,
        at_kill=record,
        poll_s=0.02,
    )


@dataclass
class KilledRun:
    """What :func:`kill_once_checkpointed` saw."""

    report: dict[str, Any]
    cluster: Any  # the closed TcpCluster (its physical topology, recovered workers)
    store: Any  # the run's checkpoint store
    checkpoint_at_kill: int | None  # the newest complete global checkpoint then
    sent_at_kill: int  # tuples the first source worker had sent then (-1: no kill)


def kill_once_checkpointed(tmp_path: Path, topology: Any, victims: Iterable[str]) -> KilledRun:
    """Run ``topology`` on tcp under exactly-once (a checkpoint every 300 ms, the store in
    ``tmp_path / "ck"``) and SIGKILL the first worker of each node of ``victims`` once a
    global checkpoint is complete and the first source sent a quarter of its ``count``
    (by the workers' METRIC_RESPs, never a sleep); the report once the job ended."""
    from typhoon.checkpoint.store import open_store
    from typhoon.tcp_cluster import RunOptions, TcpCluster

    topology.config.update(
        guarantee="exactly_once", checkpoint_interval_ms=300, checkpoint_store=str(tmp_path / "ck")
    )
    cluster = TcpCluster(topology, RunOptions(live=False, timeout=120), workdir=tmp_path / "run")
    at_kill: list[tuple[int | None, int]] = []
    try:
        cluster.start()
        cluster.activate()
        store = open_store(str(tmp_path / "ck"), topology.name)
        done, sent = checkpointed(cluster, store), sent_by(cluster)
        mid = topology.nodes["source"].args["count"] // 4
        clean = run_killing(
            cluster,
            first_workers(cluster, victims),
            lambda: done() is not None and sent() >= mid,
            at_kill=lambda: at_kill.append((done(), sent())),
        )
        report = cluster.report(clean)
    finally:
        cluster.close()
    checkpoint, sent_then = at_kill[0] if at_kill else (None, -1)
    return KilledRun(report, cluster, store, checkpoint, sent_then)
