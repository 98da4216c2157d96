"""Scaling spark nodes: what the planner, the agents' engine services and the autoscaler allow.

A spark node scales up only: its workers' offset logs and the output they
route belong to the running Spark query (pyspark_bridge), so the planner
refuses to take workers away or to swap, insert or remove a spark node with a
409 and a reason, the autoscaler logs a "keep" instead of asking, and a
worker added to a spark node gets the directory its driver already reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.autoscaling.autoscaler import NodeScaler, ScaleSettings, spark_window_signal
from typhoon.engine_services import EngineServices, with_planned_args
from typhoon.reconfig import ReconfigError, Remove, Scale, Swap, plan
from typhoon.topology import load_topology_text, schedule

HOSTS = ["h1", "h2"]
FN = "pyspark_bridge.examples:costly_enrichment"
TOPOLOGY = f"""
name: sp
spouts:
  - id: source
    operator: sequence_source
bolts:
  - id: enrich
    engine: spark
    operator: {FN}
    args: {{fields: [src, seq, ts, payload], params: {{cost_ms: 1}}}}
  - id: sink
    operator: sequence_check
streams:
  - {{from: source, to: enrich, grouping: shuffle}}
  - {{from: enrich, to: sink, grouping: shuffle}}
"""


def deployed(parallelism: int = 1):
    t = load_topology_text(TOPOLOGY)
    t.nodes["enrich"].parallelism = parallelism
    return t, schedule(t, HOSTS, 7, first_port=100)


def test_scale_up_of_a_spark_node_is_planned_like_any_other():
    t, phys = deployed()
    p = plan(Scale("enrich", 3), t, phys, HOSTS, 100)
    assert len(p.added) == 2 and p.removed == []
    assert p.topology.nodes["enrich"].parallelism == 3


@pytest.mark.parametrize(
    ("request_", "what"),
    [(Scale("enrich", 1), "cannot lose workers"), (Remove("enrich"), "cannot be removed")],
    ids=["scale-down", "remove"],
)
def test_the_planner_refuses_what_a_running_spark_query_cannot_follow(request_, what):
    t, phys = deployed(2)
    with pytest.raises(ReconfigError) as e:
        plan(request_, t, phys, HOSTS, 100)
    assert e.value.status == 409 and what in e.value.message, e.value.message
    assert "only scaling it up is supported" in e.value.message
    with pytest.raises(ReconfigError, match="only python nodes swap"):  # edit.py says so first
        plan(Swap("enrich", FN, {"params": {"cost_ms": 2}}), t, phys, HOSTS, 100)


def test_a_spark_node_under_a_guarantee_is_not_scaled_and_the_reason_is_one_sentence():
    t, phys = deployed()
    t.config["guarantee"] = "exactly_once"
    with pytest.raises(ReconfigError) as e:
        plan(Scale("enrich", 2), t, phys, HOSTS, 100)
    assert e.value.status == 409
    assert e.value.message.startswith(
        "spark node 'enrich' cannot be scaled under guarantee 'exactly_once': "
    )
    assert e.value.message.count(". ") == 0 and e.value.message.endswith("input")
    t.nodes["sink"].parallelism = 1
    assert plan(Scale("sink", 2), t, phys, HOSTS, 100).added  # python nodes still scale


def test_python_nodes_next_to_a_spark_node_still_scale_down():
    t, phys = deployed()
    t.nodes["sink"].parallelism = 2
    phys = schedule(t, HOSTS, 7, first_port=100)
    p = plan(Scale("sink", 1), t, phys, HOSTS, 100)
    assert len(p.removed) == 1


def test_a_worker_added_later_gets_the_planned_dir_and_the_current_topology(tmp_path: Path):
    t, phys = deployed()
    engines = EngineServices("h9", tmp_path)  # no worker here: plans, starts nothing
    first = engines.topology_for(t, phys)
    node_dir = first.nodes["enrich"].args["dir"]
    assert node_dir.endswith("spark/enrich") and engines.apps["sp"].services == []
    # a reconfiguration changed something else (a python node), and scaled enrich up
    now = load_topology_text(TOPOLOGY)
    now.nodes["enrich"].parallelism = 2
    now.nodes["sink"].args = {"seq": "seq"}
    got = engines.topology_for(now, phys)
    assert got.nodes["enrich"].args["dir"] == node_dir
    assert got.nodes["sink"].args == {"seq": "seq"} and got.nodes["enrich"].parallelism == 2
    swapped = load_topology_text(TOPOLOGY)
    swapped.nodes["enrich"].args["params"] = {"cost_ms": 5}
    with pytest.raises(ValueError, match="not the one its engine service runs"):
        engines.topology_for(swapped, phys)
    with pytest.raises(ValueError):
        with_planned_args(swapped, first)


S = ScaleSettings(up_window_s=1, down_window_s=2, cooldown_s=5, spark_window=3)


def ev(rows: int, inp: float, batch_ms: float) -> dict:
    return {"input_rows": rows, "input_rows_per_s": inp, "batch_ms": batch_ms}


def test_spark_window_needs_the_node_to_stay_behind():
    calm = ev(100, 40, 1500)
    assert spark_window_signal([calm, calm], 2500, S) is None  # not enough events yet
    assert not spark_window_signal([calm] * 3, 2500, S).over
    # one batch stalls 9 s (a loaded machine), the next one takes what arrived meanwhile:
    # over the window the node kept pace, and not every batch exceeded the trigger
    stalled, after = ev(100, 40, 9000), ev(360, 40, 1800)
    sig = spark_window_signal([calm, stalled, after], 2500, S)
    assert not sig.over, sig.reason
    # growing batches: rows arrive faster than they are processed
    growing = [ev(650, 260, 4500), ev(1170, 260, 7800), ev(2030, 260, 12000)]
    sig = spark_window_signal(growing, 2500, S)
    assert sig.over and "processed < 0.9 x input" in sig.reason and sig.load > 1.4
    # keeping pace but every batch longer than the trigger: behind its schedule
    slow = [ev(300, 100, 3000)] * 3
    sig = spark_window_signal(slow, 2500, S)
    assert sig.over and "every batch > trigger 2500" in sig.reason
    assert spark_window_signal([ev(10, 5, 100)] * 3, 2500, S).under


def test_an_idle_spark_node_is_kept_with_a_reason_never_shrunk():
    sc = NodeScaler("enrich", S, can_shrink=False)
    idle = spark_window_signal([ev(10, 5, 100)] * 3, 2500, S)
    decisions = []
    for i in range(10):
        sc.observe(idle, i * 0.5)
        d = sc.decide(3, i * 0.5)
        if d is not None:
            decisions.append(d)
    assert decisions and all(d.target is None and d.action == "keep" for d in decisions)
    assert "only scales up" in decisions[0].reason
    python = NodeScaler("sink", S)
    for i in range(10):
        python.observe(idle, i * 0.5)
        d = python.decide(3, i * 0.5)
        if d is not None:
            assert d.target == 2
            break
    else:
        pytest.fail("a python node was not scaled down")


def test_every_worker_of_a_guaranteed_spark_node_gets_the_planned_args(tmp_path: Path):
    """Under a guarantee the plan also fills in ``guarantee``: the second worker an agent
    launches must not look like a swapped node (it did, and no worker after the first
    could start on sdn)."""
    t, phys = deployed(2)
    t.config["guarantee"] = "exactly_once"
    engines = EngineServices("h9", tmp_path)
    first = engines.topology_for(t, phys)
    assert first.nodes["enrich"].args["guarantee"] == "exactly_once"
    again = engines.topology_for(t, phys)
    assert again.nodes["enrich"].args == first.nodes["enrich"].args
