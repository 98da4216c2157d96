"""NATS JetStream in -> wordcount -> file sink, over tcp with real worker processes and a
real ``nats-server -js`` (started by the fixture on a loopback port of its own).

The job is ``topologies/nats_file_wordcount.yaml``: the sink appends every word's running
count as a row ``[word, n]`` to jsonl part files, so the reference is every ``[w, 1..c_w]``
exactly once.  While the job runs, a reader lists the directory as an outside reader
would (files without a leading dot) and checks that a committed part never changes and
that no row is ever committed twice: a rollback after a SIGKILL must not take back, nor
repeat, anything a reader has seen.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from collections import Counter
from pathlib import Path

import nats
import pytest
from midrun_kill import run_killing_after_commits

from typhoon.checkpoint.store import open_store
from typhoon.operators.sources import generate_sentences
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "nats_file_wordcount.yaml"
BAD = [b"\xff\xfe not utf-8"]

pytestmark = pytest.mark.slow


def fill(nats_server, count: int, seed: int) -> Counter:
    """Stream SENTENCES (subject `sentences`): a bad message, then ``count`` sentences;
    a stream DEAD for the dead letters.  Returns the reference word counts."""
    want: Counter = Counter()
    lines = list(generate_sentences(count, seed=seed, words=6, vocabulary_size=300))
    for s in lines:
        want.update(s.split())

    async def go() -> None:
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        for name, subject in (("SENTENCES", "sentences"), ("DEAD", "sentences.dead")):
            try:
                await js.delete_stream(name)
            except nats.js.errors.NotFoundError:
                pass
            await js.add_stream(name=name, subjects=[subject])
        for payload in BAD:
            await js.publish("sentences", payload)
        for i in range(0, len(lines), 500):
            futures = [await js.publish_async("sentences", s.encode()) for s in lines[i : i + 500]]
            await asyncio.gather(*futures)
        await nc.close()

    asyncio.run(go())
    return want


def committed(out: Path) -> dict[str, bytes]:
    """The committed part files now: name -> contents."""
    files = {}
    for f in sorted(out.glob("part-*")):
        try:
            files[f.name] = f.read_bytes()
        except FileNotFoundError:  # committed files are never removed: a failure
            raise AssertionError(f"committed part {f.name} went away") from None
    return files


def rows_of(files: dict[str, bytes]) -> Counter:
    return Counter(tuple(json.loads(line)) for body in files.values() for line in body.splitlines())


def dead_letters(nats_server) -> list[str]:
    async def go() -> list[str]:
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        last = (await js.stream_info("DEAD")).state.last_seq
        out = [(await js.get_msg("DEAD", s)).headers["Typhoon-Reason"] for s in range(1, last + 1)]
        await nc.close()
        return out

    return asyncio.run(go())


@pytest.mark.parametrize(
    "guarantee,victims",
    [("exactly_once", ["count", "sink"]), ("at_least_once", ["count", "sink"])],
)
def test_nats_to_files_survives_sigkills(nats_server, tmp_path, monkeypatch, guarantee, victims):
    """A count and a sink worker are SIGKILLed mid-run after a completed global checkpoint
    with part files already committed.  Under exactly_once the committed files hold the
    reference exactly and never showed a row twice; under at_least_once no row is missing."""
    sentences = 8000
    want = fill(nats_server, sentences, seed=11)
    out = tmp_path / "out"
    monkeypatch.setenv("NATS_URL", nats_server.url)
    monkeypatch.setenv("OUT_DIR", str(out))
    t = copy.deepcopy(load_topology(TOPOLOGY))
    t.name = f"natsfile{guarantee[:2]}"
    store_dir = tmp_path / "ck"
    t.config.update(
        guarantee=guarantee, checkpoint_interval_ms=300, checkpoint_store=str(store_dir)
    )
    t.nodes["source"].args["rate"] = 1500
    expected = {(w, i) for w, n in want.items() for i in range(1, n + 1)}
    cluster = TcpCluster(t, RunOptions(live=False, timeout=180), workdir=tmp_path / "run")
    at_kill: list[int] = []
    seen: dict[str, bytes] = {}  # every committed part the reader saw, as it first saw it
    problems: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            now = committed(out) if out.exists() else {}
            for name, body in now.items():
                if seen.setdefault(name, body) != body:
                    problems.append(f"committed part {name} changed")
            if guarantee == "exactly_once":  # (at_least_once may count a replay again)
                twice = [r for r, k in rows_of(now).items() if k > 1]
                if twice:
                    problems.append(f"rows committed twice: {twice[:3]}")
                strange = set(rows_of(now)) - expected
                if strange:
                    problems.append(f"rows never in the reference: {sorted(strange)[:3]}")
            if problems:
                return
            time.sleep(0.05)

    try:
        cluster.start()
        cluster.activate()

        def rows_committed() -> int:  # once the reader saw a committed part
            return sum(rows_of(committed(out)).values()) if seen else 0

        watcher = threading.Thread(target=reader)
        watcher.start()
        store = open_store(str(store_dir), t.name)
        clean = run_killing_after_commits(
            cluster, store, victims, sentences // 4, rows_committed, at_kill
        )
        report = cluster.report(clean)
    finally:
        stop.set()
        cluster.close()
    watcher.join()
    assert not problems, problems
    assert at_kill and at_kill[0] > 0, "no rows committed mid-run before the kill"
    assert at_kill[1] < sentences, at_kill  # the source was still sending
    assert len(cluster.recovered) == len(victims), cluster.recovered
    final = committed(out)
    for name, body in seen.items():  # nothing a reader saw was taken back
        assert final.get(name) == body, name
    assert not [f for f in out.iterdir() if f.name.startswith(".")]  # nothing in progress
    got = rows_of(final)
    assert not expected - set(got), sorted(expected - set(got))[:5]
    if guarantee == "exactly_once":
        assert report["ok"], report["problems"]
        assert set(got) == expected and max(got.values()) == 1
    assert report["results"]["source"]["dropped"] == {"not_utf8": 1}
    letters = dead_letters(nats_server)  # at least once: a replay may send one again
    assert letters and set(letters) == {"not_utf8"}, letters
    epochs = [e for w in report["workers"] for e in w["restored_epochs"]]
    assert epochs and min(epochs) >= 1, epochs  # restored a checkpoint, not the start


def test_nats_down_at_submit_is_one_sentence_and_exit_2(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "NATS_URL": "nats://127.0.0.1:1", "OUT_DIR": str(tmp_path / "o")}
    p = subprocess.run(
        [sys.executable, "-m", "typhoon_cli", "run", str(TOPOLOGY), "--transport", "tcp", "-q"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip
    assert p.returncode == 2, (p.returncode, p.stderr)
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(
        "error: node 'source': nats_source: the NATS server at nats://127.0.0.1:1 does not answer"
    ), line
