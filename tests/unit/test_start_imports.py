"""What an emulated cluster's processes import to start (issue 33 item 5, start-up).

An agent, a worker zygote and the controller each import at once on two cores
when a cluster starts; networkx alone was 0.2 s of CPU in each.  The graph
searches that replaced it are checked against networkx here.
"""

from __future__ import annotations

import subprocess
import sys

import networkx as nx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from typhoon.checkpoint.partial import downstream_closure
from typhoon.checkpoint.regions import components

HEAVY = ("networkx",)


def imported(code: str) -> set[str]:
    """Top-level modules a fresh interpreter holds after running ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {name.partition(".")[0] for name in done.stdout.split()}


@pytest.mark.parametrize(
    "code",
    [
        "import typhoon.agent",
        "from typhoon.runtime.zygote_server import preload\n"
        "from typhoon.operators.builtins import PATHS\n"
        "preload(sorted(PATHS), True, 'sdn')",
        "import controller.core, controller.app_support, controller.core_recovery",
    ],
    ids=["agent", "zygote", "controller"],
)
def test_a_starting_process_does_not_import_networkx(code):
    modules = imported(code)
    assert "typhoon" in modules  # the code ran
    assert not modules & set(HEAVY)


edges_st = st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=25)


@given(edges=edges_st, failed=st.sets(st.integers(0, 11), max_size=4))
def test_downstream_closure_is_networkx_descendants(edges, failed):
    graph = nx.DiGraph(edges)
    want = set(failed)
    for w in failed:
        if w in graph:
            want |= nx.descendants(graph, w)
    assert downstream_closure(edges, failed) == frozenset(want)


@given(nodes=st.sets(st.integers(0, 9), max_size=10), edges=edges_st)
def test_components_are_networkx_connected_components(nodes, edges):
    graph = nx.Graph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from((a, b) for a, b in edges if a in nodes and b in nodes)
    want = sorted((frozenset(c) for c in nx.connected_components(graph)), key=min)
    assert components(sorted(nodes), edges) == want
