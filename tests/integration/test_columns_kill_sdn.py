"""A columnar source under ``exactly_once`` over sdn, a keyed worker SIGKILLed mid-run.

``topologies/keyed_columns.yaml`` on two emulated hosts (real OVS, Ryu running the core
alone): ``keyed_columns`` sends column blocks, a fields grouping on the int ``key``
deals them to ``max_and_prev`` (the largest and the last value per key, emitted with
each tuple), ``digest`` checksums every output.  Once the source sent a quarter of
its tuples and two global checkpoints completed since (so the rollback replays from
mid-run), the first ``peak`` worker is SIGKILLed; the core's recovery replaces it and
rolls the job back (the source in place: ``hooks.bind_operator``).  Per-key results
and the digest must equal ``keyed_columns_reference``'s: 0 lost, 0 duplicated.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import (
    emulated_cluster,
    guaranteed_job,
    kill_first,
    run_checkpointed_then,
    sent_then_checkpointed,
)
from keyed_columns_reference import check, reference

from typhoon.coordinator import Coordinator

pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_a_columnar_keyed_job_is_exact_after_a_killed_worker_over_sdn(tmp_path: Path) -> None:
    t = guaranteed_job(
        "keyed_columns.yaml", "ck", tmp_path / "ck", {"count": 60_000, "rate": 15_000},
        guarantee="exactly_once", checkpoint_interval_ms=300,
    )  # fmt: skip
    args = t.nodes["source"].args
    with emulated_cluster(tmp_path / "run", "k", hosts=2, apps=()) as c:

        def kill(coordinator: Coordinator) -> int:
            sent_then_checkpointed(coordinator, t.name, args["count"] // 4)
            return kill_first(coordinator, t.name, "peak")

        report, victim = run_checkpointed_then(c, t, kill)

    check(report, reference(args))
    assert report["ok"], report["problems"]
    incidents = {i["worker"]: i for i in report["incidents"]}
    incident = incidents[victim]
    assert incident["state"] == "rejoined" and incident["restore_epoch"] is not None, incident
    workers = {w["node"]: w for w in report["workers"]}
    source = workers["source"]
    assert source["worker"] in incident["rolled_back"], incident  # rolled back in place
    assert 0 < source["replayed_from"]["emitted"] < args["count"], source["replayed_from"]
    assert source["columns_out"] >= args["count"] and "columns_as_rows" not in source, source
    assert len({w["host"] for w in report["workers"]}) == 2
