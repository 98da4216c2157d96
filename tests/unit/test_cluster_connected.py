"""The emulated cluster's start-up wait reads the controller's switch gauge (mininet_env/run.py)."""

from __future__ import annotations

from mininet_env.run import switches_connected

METRICS = """\
# HELP typhoon_switch_connected 1 while the host's bridge is connected.
# TYPE typhoon_switch_connected gauge
typhoon_switch_connected{host="h1"} 1.0
typhoon_switch_connected{host="h2"} 0.0
typhoon_switch_flows{host="h1"} 27.0
typhoon_switch_connected{host="h3"} NaN
"""


def test_each_hosts_gauge_is_read_and_only_1_means_up():
    assert switches_connected(METRICS) == {"h1": True, "h2": False, "h3": False}


def test_no_gauge_says_nothing():
    assert switches_connected("") == {}
    assert switches_connected('typhoon_switch_flows{host="h1"} 1.0\n') == {}
