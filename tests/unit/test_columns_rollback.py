"""Rollback of a columnar job: the model network of real framework layers
(``test_guarantee_model.Net``) running a columnar source under ``exactly_once``, one
worker killed mid-run, every other worker rolled back in place.

A rollback builds each live worker's operator again from its checkpoint.  Before
``hooks.bind_operator`` it rebound only the row hooks: a rolled-back columnar source
went on emitting from the dropped instance's position (``next_columns``), so the
tuples between its checkpointed offset and the rollback were lost, and a rolled-back
bolt with ``process_columns`` fed the dropped instance, so its restored state never
saw another block.  Both runs failed that way before the fix.
"""

from __future__ import annotations

import pytest
from keyed_columns_reference import reference
from test_guarantee_model import Net

from typhoon.operators.sinks import SequenceCheck

KEYED = """
name: colmodel
config: {{guarantee: exactly_once, checkpoint_interval_ms: 5}}
spouts:
  - {{id: source, operator: keyed_columns, args: {{count: {count}, keys: 16, seed: 3,
      rate: 20000}}}}
bolts:
  - {{id: peak, operator: max_and_prev, parallelism: 2}}
  - {{id: sink, operator: digest}}
streams:
  - {{from: source, to: peak, grouping: {{type: fields, fields: [key]}},
      columns: {{key: int64, name: str, seq: int64, value: int64}}}}
  - {{from: peak, to: sink, grouping: shuffle}}
"""

FORWARD = """
name: colforward
config: {{guarantee: exactly_once, checkpoint_interval_ms: 5}}
spouts:
  - {{id: source, operator: sequence_columns, args: {{count: {count}, size: 8, rate: 20000}}}}
bolts:
  - {{id: sink, operator: sequence_check}}
streams:
  - {{from: source, to: sink, grouping: shuffle,
      columns: {{src: int64, seq: int64, ts: float64, payload: bytes}}}}
"""

COUNT = 3000


def _run(net: Net, node: str, index: int = 0, turns: int = 80) -> int:
    """Run ``turns`` turns, kill worker ``index`` of ``node``, run to the end; its id."""
    net.run_out(limit=turns)
    victim = [w.worker_id for w in net.phys.workers if w.node == node][index]
    assert not net.fws[victim].done, "the kill came after the end"
    net.kill(victim)
    net.run_out()
    return victim


def _of(net: Net, node: str) -> list:
    return [net.fws[w.worker_id] for w in net.phys.workers if w.node == node]


@pytest.mark.parametrize("victim", ["peak", "sink", "source"])
def test_a_columnar_keyed_job_rolled_back_in_place_is_exact(victim: str) -> None:
    """``keyed_columns`` (blocks) → ``max_and_prev`` (fields on the int key) → ``digest``:
    killing ``peak`` or ``sink`` rolls the source back in place (its ``next_columns``
    must be the restored instance's); the digest of every output and each key's max
    and last value equal the reference."""
    net = Net(job=KEYED.format(count=COUNT))
    _run(net, victim)
    assert net.restored, net.restored
    (source,) = _of(net, "source")
    if victim != "source":
        assert source.rollbacks == 1 and source.op.emitted == COUNT
    want = reference({"count": COUNT, "keys": 16, "seed": 3})
    (sink,) = _of(net, "sink")
    assert sink.op.result() == want["digest"]
    peaks: dict = {}
    lasts: dict = {}
    for fw in _of(net, "peak"):
        r = fw.op.result()
        assert not set(r["max"]) & set(peaks)  # each key on one worker
        peaks.update(r["max"])
        lasts.update(r["last"])
    assert peaks == want["max"] and lasts == want["last"]


def test_a_bolt_taking_columns_rolled_back_in_place_keeps_its_restored_state() -> None:
    """``sequence_columns`` → ``sequence_check`` (``process_columns``): killing the
    source rolls the sink back in place; the blocks after the rollback must reach the
    restored instance: every tuple once, none missing."""
    net = Net(job=FORWARD.format(count=COUNT))
    _run(net, "source")
    (sink,) = _of(net, "sink")
    assert sink.rollbacks == 1
    merged = SequenceCheck.merge_results([sink.op.result()])
    assert merged["duplicates"] == 0, merged
    assert list(merged["distinct"].values()) == [COUNT], merged
    assert sink.columnar is not None and sink.columnar.blocks_in >= COUNT
