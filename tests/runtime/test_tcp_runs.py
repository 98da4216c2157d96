"""Whole runs over the tcp transport: real worker processes, real sockets, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from midrun_kill import first_workers, kill_once_checkpointed, run_killing, sent_by

from typhoon.operators.sources import generate_sentences
from typhoon.report import read_worker_reports

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "topologies"
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "topologies"

pytestmark = pytest.mark.slow


def typhoon(
    *args: str, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "typhoon_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def run_report(tmp_path: Path, file: Path, *extra: str, env: dict | None = None) -> dict:
    report = tmp_path / "r.json"
    p = typhoon(
        "run", str(file), "--transport", "tcp", "--report", str(report), "-q", *extra, env=env
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(report.read_text())


def test_wordcount_counts_equal_reference(tmp_path):
    # wordcount.yaml with a key_origins sink behind count: what count_by_key emits is checked
    text = (TOPOLOGIES / "wordcount.yaml").read_text() + (
        "  - from: count\n    to: check\n    grouping: global\n"
    )
    text = text.replace(
        "streams:\n",
        "  - id: check\n    operator: key_origins\n    args: {key: key, count: count}\nstreams:\n",
        1,
    )
    topo = tmp_path / "wordcount_checked.yaml"
    topo.write_text(text)
    work = tmp_path / "work"
    r = run_report(tmp_path, topo, "--arg", "source.count=30000", "--workdir", str(work))
    ref = Counter(
        w
        for s in generate_sentences(30000, seed=7, words=8, vocabulary_size=500)
        for w in s.split()
    )
    assert r["results"]["count"]["counts"] == dict(ref)
    assert r["results"]["source"]["emitted"] == 30000
    assert r["nodes"]["count"]["workers"] == 4
    # downstream of count: the [key, count] tuples it flushed add up to the reference, and
    # each key came from exactly one of the 4 count workers (fields grouping: one owner)
    keys = r["results"]["check"]["keys"]
    assert {k: v["sum"] for k, v in keys.items()} == dict(ref)
    assert all(len(v["from"]) == 1 for v in keys.values()), keys
    count_ids = {w["worker"] for w in r["workers"] if w["node"] == "count"}
    owners = Counter(v["from"][0] for v in keys.values())
    assert set(owners) == count_ids, (owners, count_ids)
    # each worker's own state (its own report file) holds exactly the keys it sent
    for w in read_worker_reports(work / "wordcount" / "reports"):
        if w["node"] == "count":
            mine = {k for k, v in keys.items() if v["from"] == [w["worker"]]}
            assert set(w["result"]["counts"]) == mine, w["worker"]


def test_forward_million_tuples_no_loss(tmp_path):
    r = run_report(tmp_path, TOPOLOGIES / "forward.yaml")
    sink = r["results"]["sink"]
    assert r["results"]["source"]["emitted"] == 1_000_000
    assert sink["expected"] == 1_000_000
    assert sink["missing"] == 0
    assert sink["duplicates"] == 0
    assert sink["received"] == 1_000_000


def test_batching_is_the_command_line_over_the_file_over_the_default(tmp_path):
    # the file sets the batch size and the older max_delay; --batch-size goes over the
    # file's, the file's max_delay stands for max_delay_ms (typhoon/topology/batching.py)
    text = (TOPOLOGIES / "forward.yaml").read_text()
    topo = tmp_path / "forward.yaml"
    topo.write_text(text + "config: {batch_size: 50, max_delay: 5}\n")
    work = tmp_path / "work"
    r = run_report(
        tmp_path, topo, "--batch-size", "7", "--arg", "source.count=2000", "--workdir", str(work)
    )
    assert r["results"]["sink"]["received"] == 2000 and r["results"]["sink"]["missing"] == 0
    workers = read_worker_reports(work / "forward" / "reports")
    assert len(workers) == 2
    for w in workers:
        assert (w["metrics"]["batch_size"], w["metrics"]["max_delay_ms"]) == (7, 5.0), w["node"]


def test_broadcast_every_sink_gets_every_tuple(tmp_path):
    r = run_report(tmp_path, TOPOLOGIES / "broadcast.yaml", "--arg", "source.count=50000")
    sink = r["results"]["sink"]
    assert r["nodes"]["sink"]["workers"] == 4
    assert sink["missing_per_worker"] == {str(w): 0 for w in (2, 3, 4, 5)}
    assert sink["received"] == 4 * 50000
    assert sink["duplicates"] == 0
    # tcp baseline: one serialization per receiver
    src = next(w for w in r["workers"] if w["node"] == "source")
    assert src["serializations"] == 4 * 50000


def test_duration_drains_an_endless_source(tmp_path):
    r = run_report(
        tmp_path,
        TOPOLOGIES / "forward.yaml",
        "--arg",
        "source.count=null",
        "--arg",
        "source.rate=20000",
        "--duration",
        "2",
    )
    sink = r["results"]["sink"]
    assert 20000 < sink["received"] < 80000
    assert sink["missing"] == 0 and sink["duplicates"] == 0


@pytest.mark.parametrize("name", sorted(p.name for p in (FIXTURES / "good").glob("*.yaml")))
def test_every_valid_fixture_runs(tmp_path, name):
    env = {"TYPHOON_TEST_ENGINE": "python"}
    r = run_report(tmp_path, FIXTURES / "good" / name, "--duration", "2", env=env)
    assert r["ok"]
    assert all(w["finished"] for w in r["workers"])
    for res in r["results"].values():
        if "missing" in res and res["missing"] is not None:
            assert res["missing"] == 0 and res["duplicates"] == 0


BAD = sorted(p.stem for p in (FIXTURES / "bad").glob("*.yaml"))


@pytest.mark.parametrize("name", BAD)
def test_bad_file_one_line_exit_2(name):
    expected = (FIXTURES / "bad" / f"{name}.expected").read_text().strip()
    # `run` shares the loader with `validate`; check it on every fourth file to save time
    for verb in ("validate", "run") if BAD.index(name) % 4 == 0 else ("validate",):
        p = typhoon(verb, str(FIXTURES / "bad" / f"{name}.yaml"), timeout=60)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, p.stderr
        assert "Traceback" not in p.stderr
        assert lines[0].endswith(expected.split(":", 1)[1]), (lines[0], expected)


def test_bad_override_is_usage_error():
    p = typhoon("run", str(TOPOLOGIES / "forward.yaml"), "--arg", "source.size=-3")
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "error: node 'source': bad operator arguments (size must be a non-negative integer)"
    )


EXPLODE = {
    "name": "explode",
    "spouts": [{"id": "source", "operator": "sequence_source", "args": {"count": 5000}}],
    "bolts": [
        {"id": "boom", "operator": "failing_ops:Explode", "args": {"after": 100}},
        {"id": "sink", "operator": "sequence_check"},
    ],
    "streams": [
        {"from": "source", "to": "boom", "grouping": "shuffle"},
        {"from": "boom", "to": "sink", "grouping": "shuffle"},
    ],
}


def test_a_bolt_that_raises_fails_the_run_with_its_traceback(tmp_path):
    """Exit 1, ``ok`` false, the traceback (worker, node, host) in the report on stdout
    (``--report -``) and in the summary; the logs stay in WORKDIR/NAME/ (``--workdir``);
    the run ends although the sink below the failed bolt never gets an end of stream."""
    import yaml

    file = tmp_path / "explode.yaml"
    file.write_text(yaml.safe_dump(EXPLODE))
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "runtime"), *sys.path])}
    wd = tmp_path / "wd"
    p = typhoon("run", str(file), "-q", "--report", "-", "--workdir", str(wd), env=env, timeout=60)
    assert p.returncode == 1, p.stderr
    report = json.loads(p.stdout)
    assert not report["ok"]
    first = report["failures"][0]
    assert (first["node"], first["index"], first["host"], first["exit_code"]) == (
        "boom",
        0,
        "h1",
        1,
    )
    assert first["traceback"][-1] == "ValueError: boom at tuple 101"
    assert any("failing_ops.py" in line for line in first["traceback"])
    assert first["log"] == str(wd / "explode" / f"worker-{first['worker']}.log")
    assert report["problems"][0] == (
        f"worker {first['worker']} (boom[0]) on h1 failed (exit code 1): "
        "ValueError: boom at tuple 101"
    )
    assert "    | ValueError: boom at tuple 101" in p.stderr.splitlines()
    assert "ValueError: boom at tuple 101" in Path(first["log"]).read_text()
    assert sorted(x.name for x in (wd / "explode" / "reports").iterdir()) == [
        "worker-1.json",
        "worker-2.json",
        "worker-3.json",
    ]


@pytest.mark.parametrize(
    "victims",
    [
        ["count"],
        ["split"],
        # two of the three nodes: a further variant of the one- and three-node kills
        pytest.param(["count", "split"], marks=pytest.mark.long),
        ["source"],
        ["source", "split", "count"],
    ],
)
def test_tcp_exactly_once_survives_killed_workers(tmp_path: Path, victims: list[str]) -> None:
    """Guaranteed processing on tcp: once a global checkpoint is complete, SIGKILLed
    workers are relaunched from it and the job rolls back; the counts equal the
    reference, every restore went to that checkpoint or a newer one (a rollback to
    the start with a full replay would be exact too), and the source replayed from
    the offset its checkpoint holds."""
    import copy

    import msgpack

    from typhoon.topology import load_topology

    t = copy.deepcopy(load_topology(ROOT / "topologies" / "wordcount.yaml"))
    t.name = "tcpeo"
    args = t.nodes["source"].args
    args.update(count=12_000, rate=4_000)
    run = kill_once_checkpointed(tmp_path, t, victims)
    report, cluster, store = run.report, run.cluster, run.store
    mid = args["count"] // 4
    assert run.sent_at_kill >= mid, run.sent_at_kill  # the kill came mid-run, not on a timeout
    assert len(cluster.recovered) == len(victims), cluster.recovered
    # wordcount is one failover region: each death rolls every worker back
    everyone = sorted(w.worker_id for w in cluster.physical.workers)
    incidents = report["incidents"]
    assert all(i["rollback"] == "global" and i["region"] == everyone for i in incidents), incidents
    want = Counter()
    for s in generate_sentences(args["count"], args["seed"], args["words"], args["vocabulary"]):
        want.update(s.split())
    counts = {k: int(v) for k, v in report["results"]["count"]["counts"].items()}
    assert counts == dict(want)
    assert report["ok"], report["problems"]
    epochs = [e for w in report["workers"] for e in w["restored_epochs"]]
    before = run.checkpoint_at_kill
    assert before is not None and epochs and min(epochs) >= before >= 1, (before, epochs)
    (source,) = [w for w in report["workers"] if w["node"] == "source"]
    saved = msgpack.unpackb(
        store.read(source["restored_epochs"][-1], "source-0"), raw=False, strict_map_key=False
    )
    assert source["replayed_from"] == saved["offset"], (source["replayed_from"], saved)
    assert 0 < source["replayed_from"]["emitted"] < args["count"], source["replayed_from"]
    # every generation's peers came (the coordinator says which generation they are of):
    # no worker waited for them in vain before sending (typhoon.runtime.tcp)
    late = {w["worker"]: w["drops"].get("peers_late") for w in report["workers"]}
    assert not any(late.values()), late


@pytest.mark.parametrize(
    "victims",
    [
        pytest.param(["count_1"], id="one"),
        pytest.param(["count_1", "split_2"], marks=pytest.mark.long, id="two_pipelines"),
    ],
)
def test_tcp_region_failover_rolls_back_only_the_dead_workers_pipeline(
    tmp_path: Path, victims: list[str]
) -> None:
    """No flag, no app: a guarantee recovers on tcp, and only what the failure touched.
    ``topologies/pipelines.yaml`` is three independent pipelines (three failover regions).
    A count worker of pipeline 1 (and, in the long variant, a split worker of pipeline 2
    at the same time) is SIGKILLed once a global checkpoint is complete and source_1
    sent 2,000 sentences (a baseline for the sinks' rate): each incident says
    ``"rollback": "region"``, its region and ``rolled_back`` are its pipeline's workers
    only, it restored a checkpoint, and says when its sinks were back at 80%; the
    workers of the untouched pipelines never restored nor rolled back; every pipeline's
    counts are exact and the report is ok."""
    import copy
    import signal
    import time

    from typhoon.report import restored_epochs
    from typhoon.tcp_cluster import RunOptions, TcpCluster
    from typhoon.topology import load_topology

    t = copy.deepcopy(load_topology(TOPOLOGIES / "pipelines.yaml"))
    t.name = "tcpregion"
    for i in (1, 2, 3):
        t.nodes[f"source_{i}"].args.update(count=6_000, rate=1_000)
    t.config.update(checkpoint_store=str(tmp_path / "ck"))
    cluster = TcpCluster(t, RunOptions(live=False, timeout=120), workdir=tmp_path / "run")
    killed: list[float] = []
    try:
        cluster.start()
        cluster.activate()
        dead = first_workers(cluster, victims)
        sent = sent_by(cluster, "source_1")
        clean = run_killing(
            cluster,
            dead,
            # a completed global checkpoint, as the run coordinator heard of it
            lambda: cluster.progress.global_epoch(cluster.physical) is not None and sent() >= 2_000,
            kill_on_timeout=False,
            at_kill=lambda: killed.append(time.monotonic() - cluster.started_at),
            poll_s=0.05,
        )
        report = cluster.report(clean)
    finally:
        cluster.close()
    assert killed, "no global checkpoint before the end"
    # what each pipeline's sinks took in per second (live polls), for the docs
    for h in report["rates"]:
        rates = {n: round(h["rates"][f"count_{n}"]["in"]) for n in (1, 2, 3)}
        print(f"t {h['t'] - killed[0]:+.1f} s from the kill: count_N in/s {rates}")
    for i in (1, 2, 3):
        args = t.nodes[f"source_{i}"].args
        want = Counter()
        for s in generate_sentences(args["count"], args["seed"], args["words"], args["vocabulary"]):
            want.update(s.split())
        counts = {k: int(v) for k, v in report["results"][f"count_{i}"]["counts"].items()}
        assert counts == dict(want), i
    assert report["ok"], report["problems"]
    assert sorted(report["recovered"]) == sorted(dead)
    incidents = {i["worker"]: i for i in report["incidents"]}
    assert sorted(incidents) == sorted(dead), report["incidents"]
    touched: set[int] = set()
    keys = ("rollback", "region", "rolled_back", "restore_epoch", "replayed", "rejoined_ms")
    keys += ("rolled_back_ms", "sink_rate_before", "sink_rate_lowest", "back_at_80_ms")
    for node, victim in zip(victims, dead, strict=True):
        incident, n = incidents[victim], node.rsplit("_", 1)[1]
        print("incident:", {k: incident[k] for k in keys})
        assert incident["node"] == node and incident["state"] == "rejoined", incident
        assert incident["exit_code"] == -signal.SIGKILL, incident
        assert incident["restore_epoch"] is not None, incident  # a checkpoint, not the start
        mine = {w.worker_id for w in cluster.physical.workers if w.node.endswith(f"_{n}")}
        assert incident["rollback"] == "region" and set(incident["region"]) == mine, incident
        assert set(incident["rolled_back"]) == mine - {victim}, incident
        (source,) = cluster.physical.of_node(f"source_{n}")
        assert {int(w) for w in incident["replayed"]} == {source.worker_id}, incident
        assert incident["sinks"] == [f"count_{n}"], incident
        assert incident["back_at_80_ms"] is not None, incident
        touched |= mine
    by_worker = {r["worker"]: r for r in read_worker_reports(cluster.report_dir)}
    assert len(by_worker) == 15 and len(touched) == 5 * len(victims)
    for w, r in by_worker.items():
        if w in touched:
            assert restored_epochs(r["metrics"]), r["metrics"]  # rolled back, or restored
        else:
            assert restored_epochs(r["metrics"]) == [], r["metrics"].get("restored_epochs")
            assert r["metrics"].get("rollbacks", 0) == 0, r["metrics"]
            assert r["metrics"].get("generation") == 0, r["metrics"]
    for victim in dead:
        replacement = by_worker[victim]["metrics"]
        assert restored_epochs(replacement)[0] == incidents[victim]["restore_epoch"]


def test_locality_pair_statistics_in_a_real_run(tmp_path):
    """config: locality makes the workers of `a` count sampled (a, b) pairs; the top
    pairs are the correlated ones and the counts stay exact."""
    from typhoon.operators.pairs import expected_counts, partner

    r = run_report(tmp_path, TOPOLOGIES / "locality.yaml", "--arg", "source.count=30000")
    assert r["ok"], r["problems"]
    want_a, want_b = expected_counts(30000, 1, 200, 200, 0.8, 1)
    assert r["results"]["a"]["counts"] == want_a
    assert r["results"]["b"]["counts"] == want_b
    a_workers = [w for w in r["workers"] if w["node"] == "a"]
    assert len(a_workers) == 3
    # rows 10, 20, ... of each worker's input (counted across batches)
    assert [w["pairs_sampled"] for w in a_workers] == [
        sum(w["in"].values()) // 10 for w in a_workers
    ]
    counted = [(a, b, c) for w in a_workers for a, bs in w["pairs"].items() for b, c in bs.items()]
    assert sum(c for *_, c in counted) > 0
    # one sampled tuple in 10, 80% correlated: each key a's most counted b is its partner
    best: dict[str, tuple[int, str]] = {}
    for a, b, c in counted:
        best[a] = max(best.get(a, (0, "")), (c, b))
    assert all(b == f"b{partner(int(a[1:]), 1, 200)}" for a, (_, b) in best.items())
    assert len(best) == 200
