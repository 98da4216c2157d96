"""A tcp rescale under ``exactly_once`` with a SIGKILL right after it, or in the middle of
it: real worker processes, real sockets, a real checkpoint store on disk
(``typhoon/tcp_reconfig.py``, ``typhoon/tcp_recovery.py``, docs/guarantees.md).

``topologies/running_max.yaml`` is not additive: ``running_count`` emits each word's
running count on every tuple and ``max_by_key`` keeps the largest per word, so the
maxima equal the word counts only if every word's count went on from where it was
through the rescale and through the recovery.  Each scaled run is compared with the
same job run over tcp under ``exactly_once`` without reconfiguration (and with the counts
computed from the source's generator):

* scale ``count`` 4 -> 6, then at once SIGKILL an added worker (groups moved to it);
* scale ``count`` 4 -> 2, then at once SIGKILL a staying worker that took groups;
* scale ``count`` 4 -> 6 and SIGKILL an old owner just before the coordinator sends it
  ``KEYGROUPS finish`` (it never ships its groups): the coordinator restarts every
  worker in the final topology from a checkpoint, and the rescale ends ``restarted``.

After the run each word's state is on exactly one count worker, the one the final
routes send it to.
"""

from __future__ import annotations

import copy
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from typhoon.live import data_tuples
from typhoon.operators.sources import generate_sentences
from typhoon.reconfig import Scale
from typhoon.report import read_worker_reports
from typhoon.runtime.policies import Router
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.tcp_reconfig import Record
from typhoon.topology import keygroups, load_topology
from typhoon.topology.routing import routes_for
from typhoon.wire import Control, ControlTuple

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = 24_000
RATE = 2_000  # sentences per second: a 12 s run

pytestmark = pytest.mark.slow


def job(name: str, store: Path, rate: int | None):
    t = copy.deepcopy(load_topology(ROOT / "topologies" / "running_max.yaml"))
    t.name = name
    t.config.update(
        guarantee="exactly_once", checkpoint_interval_ms=300, checkpoint_store=f"file://{store}"
    )
    t.nodes["source"].args.update(count=SENTENCES, seed=5)
    if rate:
        t.nodes["source"].args["rate"] = rate
    return t


def reference() -> dict[str, int]:
    words: Counter = Counter()
    for s in generate_sentences(SENTENCES, 5, 8, 500):
        words.update(s.split())
    return dict(words)


def wait_for(cond, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.005)


def owners(topology, physical) -> dict[int, int]:
    """Key group -> the count worker that owns it (the default table until a rescale
    writes one into the physical topology)."""
    return dict(enumerate(keygroups.owners(topology, physical, "count")))


def run(tmp_path: Path, name: str, scale: int | None = None, kill: str = "") -> dict[str, Any]:
    """The job, rescaled to ``scale`` a quarter of the way in, and ``kill``: "after" (an
    added worker, or a staying one that took groups, SIGKILLed as soon as the update is
    done) or "during" (an old owner SIGKILLed as the coordinator is about to send it
    KEYGROUPS finish)."""
    t = job(name, tmp_path / f"{name}-ckpt", RATE if scale else None)
    cluster = TcpCluster(t, RunOptions(live=False, timeout=300), workdir=tmp_path / name)
    out: dict[str, Any] = {"victim": None, "source_running": None}
    errors: list[BaseException] = []
    try:
        cluster.start()
        cluster.activate()
        start = cluster.physical
        source = start.of_node("source")[0].worker_id
        old_owner = owners(cluster.topology, start)

        if kill == "during":
            send = cluster.send
            old_counts = {w.worker_id for w in start.active_of_node("count")}

            def send_then_maybe_kill(wid: int, ct: ControlTuple) -> None:
                finishing = ct.type == Control.KEYGROUPS and ct.body.get("phase") == "finish"
                if finishing and out["victim"] is None and wid in old_counts:
                    # the first old owner the finish goes to dies holding its groups
                    out["victim"] = wid
                    out["source_running"] = cluster.procs[source].poll() is None
                    cluster.procs[wid].kill()
                    cluster.procs[wid].wait()
                send(wid, ct)

            cluster.send = send_then_maybe_kill  # type: ignore[method-assign]

        def counted() -> int:
            ws = {w.worker_id for w in cluster.physical.workers if w.node == "count"}
            return sum(data_tuples(cluster.metrics.get(w, {}).get("in", {})) for w in ws)

        def rescale() -> None:
            try:
                words = sum(reference().values())
                wait_for(lambda: counted() >= words // 4, 90, "a quarter of the words")
                rec = cluster.rescaler.request(Scale("count", scale))
                wait_for(lambda: rec.state != "pending", 120, "the rescale")
                out["rec"] = rec
                if kill == "after":
                    final = owners(cluster.topology, rec.physical)
                    took = sorted({w for g, w in final.items() if old_owner.get(g) != w})
                    victim = rec.added[-1] if rec.added else took[0]
                    out["victim"] = victim
                    out["source_running"] = cluster.procs[source].poll() is None
                    cluster.procs[victim].send_signal(signal.SIGKILL)
            except BaseException as e:  # reported by the test, not lost in the thread
                errors.append(e)

        thread = threading.Thread(target=rescale) if scale else None
        if thread is not None:
            thread.start()
        clean = cluster.wait()
        if thread is not None:
            thread.join()
        out["report"] = cluster.report(clean)
        out["physical"] = cluster.physical
        out["topology"] = cluster.topology
        out["incidents"] = list(cluster.incidents)
        out["workers"] = read_worker_reports(cluster.report_dir)
    finally:
        cluster.close()
    assert not errors, errors
    return out


def check_exact(plain: dict[str, Any], scaled: dict[str, Any]) -> None:
    report = scaled["report"]
    assert report["ok"], report["problems"]
    merged = report["results"]["max"]
    assert merged["keys_on_several_workers"] == 0
    assert merged["max"] == plain["report"]["results"]["max"]["max"]  # as without a rescale
    assert merged["max"] == reference()
    # each word's state on exactly one count worker: the one the final routes send it to
    final = scaled["physical"]
    active = {w.worker_id for w in final.active_of_node("count")}
    holders: dict[str, list[int]] = {}
    for w in scaled["workers"]:
        if w["node"] == "count" and w["worker"] in active:
            for k in w["result"]["key_list"]:
                holders.setdefault(k, []).append(w["worker"])
    assert set(holders) == set(reference())
    split = final.of_node("split")[0].worker_id
    (route,) = routes_for(scaled["topology"], final, split)
    router = Router(route)
    wrong = {k: ws for k, ws in holders.items() if ws != [router.select([k])]}
    assert not wrong, list(wrong.items())[:10]


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict[str, Any]:
    """The job over tcp under exactly_once without reconfiguration."""
    out = run(tmp_path_factory.mktemp("plain"), "gtcpplain")
    assert out["report"]["ok"], out["report"]["problems"]
    assert out["report"]["results"]["max"]["max"] == reference()
    return out


@pytest.mark.parametrize(
    "to", [pytest.param(6, id="up"), pytest.param(2, marks=pytest.mark.long, id="down")]
)  # down: `make test-long` (suite time)
def test_a_sigkill_right_after_a_tcp_scale_under_exactly_once_is_exact(plain, tmp_path, to):
    scaled = run(tmp_path, f"gtcp{to}", scale=to, kill="after")
    rec: Record = scaled["rec"]
    assert rec.state == "done", rec.to_dict()
    assert scaled["source_running"], "the source had finished before the kill"
    victim = scaled["victim"]
    report = scaled["report"]
    assert victim in report["recovered"], (victim, report["recovered"])
    (incident,) = [i for i in scaled["incidents"] if i["worker"] == victim]
    assert incident["state"] == "rejoined" and incident["rollback"] == "global", incident
    print(
        f"\nscale count to {to}: {rec.seconds:.2f} s; killed {victim}; restored "
        f"{incident['restore_epoch']}; parts not written while groups moved: "
        f"{ {w['worker']: w['metrics'].get('parts_skipped') for w in scaled['workers']} }"
    )
    check_exact(plain, scaled)


def test_a_sigkill_during_a_tcp_scale_under_exactly_once_restarts_the_job_exactly(plain, tmp_path):
    scaled = run(tmp_path, "gtcpduring", scale=6, kill="during")
    rec: Record = scaled["rec"]
    victim = scaled["victim"]
    assert victim is not None and scaled["source_running"], "no kill mid-run"
    assert rec.state == "restarted", rec.to_dict()
    assert f"workers [{victim}] died" in rec.error
    assert [s["state"] for s in rec.steps][-1] == "failed"
    (incident,) = [i for i in scaled["incidents"] if i["worker"] == victim]
    assert incident["rollback"] == "restart" and incident["state"] == "rejoined", incident
    final = scaled["physical"]
    assert len(final.active_of_node("count")) == 6 and final.generation >= 1
    print(
        f"\nkilled {victim} at KEYGROUPS finish: every worker restarted from "
        f"{incident['restore_epoch']} in {incident['rejoined_ms']} ms"
    )
    check_exact(plain, scaled)
