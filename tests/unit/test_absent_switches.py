"""A restarted controller says once per host that its switch has not reconnected yet."""

from controller.absent_switches import AbsentSwitches


def test_one_calm_line_per_host_until_its_switch_connects():
    absent = AbsentSwitches()
    first = absent.note("h2")
    assert first == (
        "no switch connected for host h2 yet (switches reconnect after a controller "
        "restart): control tuples to its workers wait until it does"
    )
    assert [absent.note("h2") for _ in range(5)] == [None] * 5  # not once per worker
    assert absent.note("h3") is not None
    absent.connected("h2")
    absent.connected(None)  # a switch of no known host: nothing to forget
    assert absent.note("h2") == first  # it went away again: news again
