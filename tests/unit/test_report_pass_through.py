"""The run report knows how many tuples a sink must see through pass-through nodes."""

from __future__ import annotations

import pytest
import yaml

from typhoon.report import _sequence_sources
from typhoon.topology.loader import load_topology_text


def chain(middle: dict) -> object:
    doc = {
        "name": "chain",
        "spouts": [{"id": "source", "operator": "sequence_source", "parallelism": 2}],
        "bolts": [
            {"id": "mid", **middle, "parallelism": 2},
            {"id": "sink", "operator": "sequence_check"},
        ],
        "streams": [
            {"from": "source", "to": "mid", "grouping": "shuffle"},
            {"from": "mid", "to": "sink", "grouping": "shuffle"},
        ],
    }
    return load_topology_text(yaml.safe_dump(doc), "<chain>")


@pytest.mark.parametrize(
    "middle",
    [{"operator": "identity"}, {"operator": "busy", "args": {"cost_us": 1}}],
)
def test_a_sink_behind_a_pass_through_node_is_checked_against_the_source(middle):
    assert _sequence_sources(chain(middle), "sink") == (["source"], False)


def test_a_node_that_drops_its_tuples_leaves_the_count_unknown():
    topology = chain({"operator": "busy", "args": {"emit": False}})
    assert _sequence_sources(topology, "sink")[0] is None
