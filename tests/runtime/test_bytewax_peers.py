"""The ``peers`` scenario's Bytewax side for real: 1 and 2 processes of a Bytewax cluster
on loopback, the same sentences and tuples as Typhoon's spouts, every count checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bytewax_runs import run_bytewax
from benchmarks.peer_checks import count_diff, expected_word_counts

pytest.importorskip("bytewax", reason="the bench extra (pip install .[bench]) brings Bytewax")
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("processes", [1, 2])
def test_bytewax_wordcount_counts_every_word_of_the_generator(
    tmp_path: Path, processes: int
) -> None:
    args = {"count": 3000, "seed": 7, "words": 8, "vocabulary": 500, "batch": 100}
    run = run_bytewax("wordcount", processes, args, tmp_path, timeout=120)
    assert run.ok, run.error
    assert len(run.parts) == processes
    assert sum(p["source_here"] for p in run.parts) == 1  # one source partition
    assert count_diff(expected_word_counts(3000, 7, 8, 500), run.counts()).equal
    assert run.arrivals().total == 3000 * 8  # every fold step is on the clock


def test_bytewax_forward_redistributes_across_processes(tmp_path: Path) -> None:
    run = run_bytewax("forward", 2, {"count": 20000, "size": 100, "batch": 100}, tmp_path)
    assert run.ok, run.error
    seq = run.sequence(20000)
    assert (seq.received, seq.missing, seq.duplicates) == (20000, 0, 0)
    assert 0 < run.crossed() < 20000  # a random worker per item: some cross, some stay
    assert run.sink_rate()


def test_a_bytewax_process_that_fails_fails_the_run(tmp_path: Path) -> None:
    run = run_bytewax("forward", 1, {"count": "many"}, tmp_path)  # argparse refuses it
    assert not run.ok and "exited with" in run.error
