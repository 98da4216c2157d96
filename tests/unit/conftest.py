"""Fixtures shared by the unit tests of live unchaining and of the verbs on chained nodes."""

from __future__ import annotations

import pytest


@pytest.fixture
def fwd(tmp_path):
    """A coordinator and manager holding app ``fwd``, its source and sink chained, active."""
    from test_reconfig_executor import FORWARD, FakeCore

    from typhoon.cluster import Cluster, HostInfo
    from typhoon.coordinator import SqliteCoordinator
    from typhoon.manager import Manager
    from typhoon.topology import load_topology_text

    c = SqliteCoordinator(tmp_path / "coord.db")
    c.put_cluster(Cluster({"h1": HostInfo("h1", "br1", 1, first_worker_port=100)}))
    m = Manager(c)
    m.submit(load_topology_text(FORWARD.replace("shuffle", "forward")))  # source+sink chained
    c.put_app_state("fwd", {"active": True})
    yield c, m, FakeCore
    c.close()
