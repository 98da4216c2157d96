"""A spout whose ACTIVATE was lost is found from its METRIC_RESP (controller/progress.py)."""

from __future__ import annotations

from controller.progress import ACTIVATE_GRACE_S, lost_activation

START = (100.0, frozenset({1, 2}))


def test_a_start_spout_still_inactive_after_the_grace_lost_its_activate():
    assert lost_activation(START, 2, {"active": 0}, 100.0 + ACTIVATE_GRACE_S)


def test_not_lost_while_it_may_still_be_on_its_way_or_once_it_took_effect():
    assert not lost_activation(START, 2, {"active": 0}, 100.0 + ACTIVATE_GRACE_S / 2)
    assert not lost_activation(START, 2, {"active": 1}, 200.0)


def test_only_the_spouts_activated_at_the_start_count():
    # a replacement spout waits for the fault detector's ACTIVATE after its routes
    assert not lost_activation(START, 7, {"active": 0}, 200.0)
    assert not lost_activation(None, 1, {"active": 0}, 200.0)  # nothing activated yet
    assert not lost_activation(START, 1, {}, 200.0)  # a reply without the field
