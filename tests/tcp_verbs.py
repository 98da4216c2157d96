"""Drive a tcp run's reconfiguration verbs mid-run, as a test would type them.

``run_verbs`` starts a :class:`typhoon.tcp_cluster.TcpCluster`, requests each verb
once the run's progress reached its share (by default the share of their sentences
the sources sent; from the workers' METRIC_RESPs, never a sleep), waits for it to end
and returns the run's report with the records.  Shared by the live-unchaining, the
chained swap-in-place and the keyed rescale tests on tcp; with ``cli=True`` each verb
is typed (``typhoon unchain NAME NODE``) against the run's control endpoint instead.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typhoon_cli
from typhoon.live import data_tuples
from typhoon.operators.sources import generate_sentences
from typhoon.reconfig import Scale
from typhoon.reconfig.requests import Chain, Request, Unchain
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.tcp_control import serving
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


def sent_share(cluster: TcpCluster) -> float:
    """The share of the sentences the sources sent so far: ``run_verbs``' default
    progress."""
    return sent(cluster) / cluster.topology.nodes["source"].args["count"]


def frames_out(cluster: TcpCluster, node: str, after: int) -> dict[int, int]:
    """Each worker of ``node``'s frames sent, from a METRIC_RESP to a request made after
    request id ``after`` (waited for)."""
    ws = [w.worker_id for w in cluster.physical.of_node(node)]
    wait_for(
        lambda: all(cluster.replies.get(w, (0,))[0] > after for w in ws), 10, "metrics replies"
    )
    return {w: cluster.replies[w][1]["frames_out"] for w in ws}


def cli_argv(name: str, request: Request) -> list[str]:
    """The ``typhoon`` command line of ``request`` on the job ``name``."""
    if isinstance(request, (Unchain, Chain)):
        kind = "unchain" if isinstance(request, Unchain) else "chain"
        one = [] if request.worker is None else ["--worker", str(request.worker)]
        return [kind, name, request.node, *one]
    if isinstance(request, Scale):
        return ["scale", name, request.node, str(request.parallelism)]
    raise ValueError(f"no command line for {request}")


def run_verbs(
    tmp_path: Path,
    t: Any,
    verbs: list[tuple[float, Request]],
    senders: str | None,
    progress: Callable[[TcpCluster], float] = sent_share,
    options: RunOptions | None = None,
    done_within: float = 60.0,
    cli: bool = False,
) -> tuple[dict, list[Record], list[dict[int, int]], TcpCluster]:
    """Run ``t``; once ``progress`` reaches each verb's share, ``cluster.rescaler.request``
    the verb (``cli``: type it, ``typhoon_cli.main``, against the run's control endpoint,
    typhoon/tcp_control.py) and wait until it is done (``done_within`` seconds), then
    check that the sources were still running; after each, the frames each worker of
    ``senders`` (the chained edge's sending node; None: not asked) sent so far."""
    total = t.nodes["source"].args["count"]
    if options is None:
        options = RunOptions(live=False, live_every=0.2, timeout=120)
    cluster = TcpCluster(t, options, workdir=tmp_path)
    sources = [w.worker_id for w in cluster.physical.of_node("source")]
    records: list[Record] = []
    frames: list[dict[int, int]] = []
    errors: list[BaseException] = []

    def run_one(request: Request) -> Record:
        if cli:  # returns once the update has ended (the CLI waits for it)
            code = typhoon_cli.main(cli_argv(t.name, request))
            assert code == 0, f"typhoon {' '.join(cli_argv(t.name, request))}: exit {code}"
            return cluster.rescaler.records[-1]
        rec = cluster.rescaler.request(request)
        wait_for(lambda: rec.state != "pending", done_within, f"{request} done")
        return rec

    def drive() -> None:
        try:
            for share, request in verbs:
                # mid-run by progress (the workers' METRIC_RESPs), never a sleep
                wait_for(lambda share=share: progress(cluster) >= share, 60, "progress")
                rec = run_one(request)
                assert rec.request == request, (rec.request, request)
                records.append(rec)
                if senders is not None:
                    frames.append(frames_out(cluster, senders, cluster.next_version()))
                assert sent(cluster) < total, f"the sources had finished at {request}"
                assert all(cluster.procs[w].poll() is None for w in sources), (
                    f"a source had exited at {request}"
                )
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    try:
        cluster.start()
        with serving(cluster, "127.0.0.1:0" if cli else None, sys.stderr) as endpoint:
            cluster.activate()
            thread = threading.Thread(target=drive)
            thread.start()
            clean = cluster.wait()
            thread.join()
        report = cluster.report(clean)
        if endpoint is not None:
            report["control_endpoint"] = endpoint.api.summary()
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


def over_tcp_between_the_verbs(report: dict, frames: list[dict[int, int]], senders: str) -> None:
    """Each worker of ``senders`` (which sends on the chained edge only) sent frames
    between `unchain` and `chain` and none after (rows by function call again)."""
    workers = {w["worker"]: w for w in report["workers"] if w["node"] == senders}
    on_net, after_chain = frames
    assert sorted(workers) == sorted(after_chain)
    for w, r in workers.items():
        assert after_chain[w] > on_net[w], (w, frames)
        assert r["frames_out"] == after_chain[w], (w, r["frames_out"], frames)
