"""A locality move on a tcp run: the locality router's job of sdn driven by the tcp run
loop (``typhoon run --transport tcp --locality AT``, typhoon_cli/tcp_locality.py), its two
``direct`` reroutes run by the tcp executor with the pinned keys' state moving along,
under ``exactly_once``, with and without a SIGKILL of a count worker right after it.

``running_max`` with ``config: locality`` makes ``count`` (keyed on the word, emitting
``[word, n]`` keyed on the word to ``max``) the counting node: its pairs are perfectly
correlated, and the move pins the hot words of both streams to one host.  The maxima
must equal those of the same job over tcp under ``exactly_once`` without
reconfiguration (``plain``, from test_guaranteed_rescale_tcp), and each word's state
must be on the one count worker the final routes (the direct table) send it to.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_guaranteed_rescale_tcp import RATE, ROOT, check_exact, job, plain
from test_keyed_rescale_tcp import reference as words_of

from typhoon.report import read_worker_reports
from typhoon.tcp_cluster import RunOptions, TcpCluster
from typhoon_cli.tcp_locality import TcpLocality

__all__ = ["plain"]  # the fixture: the job over tcp under exactly_once, no reconfiguration

pytestmark = pytest.mark.slow
HOSTS = ["h1", "h2", "h3"]


def run(tmp_path: Path, name: str, kill: bool) -> dict[str, Any]:
    t = job(name, tmp_path / f"{name}-ckpt", RATE)
    t.config["locality"] = {"pairs": 2000, "sample": 5}
    driver = TcpLocality(3.0)
    options = RunOptions(hosts=HOSTS, live=False, timeout=300, on_turn=[driver])
    cluster = TcpCluster(t, options, workdir=tmp_path / name)
    out: dict[str, Any] = {"victim": None, "source_running": None}
    errors: list[BaseException] = []
    stop = threading.Event()
    try:
        cluster.start()
        cluster.activate()
        source = cluster.physical.of_node("source")[0].worker_id

        def kill_after_the_move() -> None:
            try:
                while not stop.is_set():
                    j = driver.job
                    if j is not None and j.phase in ("measuring", "done", "failed", "skipped"):
                        break
                    time.sleep(0.005)
                if stop.is_set() or driver.job.phase not in ("measuring", "done"):
                    return
                victim = cluster.physical.active_of_node("count")[0].worker_id
                out["victim"] = victim
                out["source_running"] = cluster.procs[source].poll() is None
                cluster.procs[victim].send_signal(signal.SIGKILL)
            except BaseException as e:  # reported by the test, not lost in the thread
                errors.append(e)

        thread = threading.Thread(target=kill_after_the_move) if kill else None
        if thread is not None:
            thread.start()
        clean = cluster.wait()
        stop.set()
        if thread is not None:
            thread.join()
        out["report"] = cluster.report(clean)
        out["locality"] = driver.report()
        out["records"] = list(cluster.rescaler.records)
        out["physical"] = cluster.physical
        out["topology"] = cluster.topology
        out["incidents"] = list(cluster.incidents)
        out["workers"] = read_worker_reports(cluster.report_dir)
    finally:
        cluster.close()
    assert not errors, errors
    return out


@pytest.mark.parametrize(
    "kill",
    [
        pytest.param(False, marks=pytest.mark.long, id="move"),
        pytest.param(True, id="move-then-sigkill"),
    ],
)  # the kill variant checks the move too; the plain one is `make test-long`
def test_a_tcp_locality_move_under_exactly_once_is_exact(plain, tmp_path, kill):
    moved = run(tmp_path, f"gtcploc{int(kill)}", kill)
    loc = moved["locality"]
    assert loc["phase"] == "done", loc
    assert loc["node"] == "count" and len(loc["reconfigurations"]) == 2, loc
    for rec in moved["records"]:
        assert rec.state == "done", rec.to_dict()
        keygroups = [s["state"] for s in rec.steps if s["what"].startswith("KEYGROUPS")]
        assert keygroups == ["done", "done"], rec.to_dict()  # pinned keys moved their state
    assert [s.grouping.type for s in moved["topology"].streams[1:]] == ["direct", "direct"]
    print(f"\nlocality move: plan {loc['plan']}; crossing {loc.get('crossing')}")
    if kill:
        victim = moved["victim"]
        assert victim is not None and moved["source_running"], "no kill mid-run"
        assert victim in moved["report"]["recovered"]
    check_exact(plain, moved)


def test_typhoon_run_locality_option_moves_a_tcp_run(tmp_path):
    out = tmp_path / "r.json"
    argv = ["run", str(ROOT / "topologies" / "running_max.yaml"), "--transport", "tcp", "-q"]
    argv += ["--hosts", "3", "--arg", "source.count=16000", "--arg", "source.rate=2000"]
    topo = tmp_path / "running_max_locality.yaml"
    text = (ROOT / "topologies" / "running_max.yaml").read_text()
    topo.write_text(text.replace("name: running_max\n", "name: running_max\nconfig:\n"
                                 "  locality: {pairs: 2000, sample: 5}\n"))  # fmt: skip
    argv[1] = str(topo)
    p = subprocess.run(
        [sys.executable, "-m", "typhoon_cli", *argv, "--locality", "2", "--report", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(out.read_text())
    assert report["locality"]["phase"] == "done", report["locality"]
    assert [r["state"] for r in report["reconfigurations"]] == ["done", "done"]
    args = {"count": 16000, "seed": 7, "words": 8, "vocabulary": 500}  # running_max.yaml's
    assert report["results"]["max"]["max"] == words_of(args)
    assert report["results"]["max"]["keys_on_several_workers"] == 0
