"""The worker frame size the agent writes into a spec: the fabric's, or less."""

from typhoon.cluster import Cluster
from typhoon.worker_specs import WORKER_MTU, worker_mtu


def test_emulation_keeps_its_large_frames():
    assert worker_mtu({}, None) == WORKER_MTU == 64000  # the emulated links carry 65,000
    assert worker_mtu({}, Cluster()) == 64000
    assert worker_mtu({"sdn": {"mtu": 4000}}, Cluster()) == 4000


def test_fabric_mtu_caps_what_a_topology_asks():
    tunnel = Cluster(mtu=1450)
    assert worker_mtu({}, tunnel) == 1450
    assert worker_mtu({"sdn": {"mtu": 1000}}, tunnel) == 1000
    assert worker_mtu({"sdn": {"mtu": 9000}}, tunnel) == 1450
