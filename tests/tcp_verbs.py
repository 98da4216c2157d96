"""Drive a tcp run's reconfiguration verbs mid-run, as a test would type them.

``run_verbs`` starts a :class:`typhoon.tcp_cluster.TcpCluster`, requests each verb
once the sources have sent a share of their sentences (their METRIC_RESPs, never
a sleep), waits for it to end and returns the run's report with the records.
Shared by the live-unchaining and the chained swap-in-place tests on tcp.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typhoon.live import data_tuples
from typhoon.operators.sources import generate_sentences
from typhoon.reconfig.requests import Request
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.tcp_reconfig import Record


def reference(args: dict) -> dict[str, int]:
    want: Counter[str] = Counter()
    for s in generate_sentences(args["count"], args["seed"], args["words"], args["vocabulary"]):
        want.update(s.split())
    return dict(want)


def wait_for(cond: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.01)


def sent(cluster: TcpCluster) -> int:
    """Sentences every source worker sent so far (their METRIC_RESPs)."""
    ws = [w.worker_id for w in cluster.physical.of_node("source")]
    return sum(data_tuples(cluster.metrics.get(w, {}).get("out", {})) for w in ws)


def frames_out(cluster: TcpCluster, node: str, after: int) -> dict[int, int]:
    """Each worker of ``node``'s frames sent, from a METRIC_RESP to a request made after
    request id ``after`` (waited for)."""
    ws = [w.worker_id for w in cluster.physical.of_node(node)]
    wait_for(
        lambda: all(cluster.replies.get(w, (0,))[0] > after for w in ws), 10, "metrics replies"
    )
    return {w: cluster.replies[w][1]["frames_out"] for w in ws}


def run_verbs(
    tmp_path: Path, t: Any, verbs: list[tuple[float, Request]], senders: str
) -> tuple[dict, list[Record], list[dict[int, int]], TcpCluster]:
    """Run ``t``; at each share of the sentences sent, ``cluster.rescaler.request`` the
    verb and wait until it is done; after each, the frames each worker of ``senders``
    (the chained edge's sending node) sent so far."""
    total = t.nodes["source"].args["count"]
    cluster = TcpCluster(t, RunOptions(live=False, live_every=0.2, timeout=120), workdir=tmp_path)
    records: list[Record] = []
    frames: list[dict[int, int]] = []
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            for share, request in verbs:
                # mid-run by progress (the sources' METRIC_RESPs), never a sleep
                wait_for(lambda share=share: sent(cluster) >= share * total, 60, "progress")
                rec = cluster.rescaler.request(request)
                wait_for(lambda rec=rec: rec.state != "pending", 60, f"{request} done")
                records.append(rec)
                frames.append(frames_out(cluster, senders, cluster.next_version()))
                assert sent(cluster) < total, f"the sources had finished at {request}"
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    try:
        cluster.start()
        cluster.activate()
        thread = threading.Thread(target=drive)
        thread.start()
        clean = cluster.wait()
        thread.join()
        report = cluster.report(clean)
    finally:
        cluster.close()
    assert not errors, errors
    for rec in records:
        assert rec.state == "done", rec.to_dict()
    return report, records, frames, cluster


def no_loss(report: dict) -> None:
    assert report["ok"], report["problems"]
    for w in report["workers"]:
        assert not w["drops"] and not w["seq_gaps"], w
