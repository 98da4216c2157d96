"""The ad-analytics references: the counts a filter swap (paper Fig. 14) must produce."""

from __future__ import annotations

from collections import Counter

from typhoon.operators.ads import (
    START_MS,
    campaign_table,
    generate_ad_events,
    per_window,
    reference_swap_counts,
    reference_window_counts,
)


def by_hand(count: int, cut: int, per_second: int) -> Counter:
    table = dict(campaign_table())
    out: Counter = Counter()
    for i, e in enumerate(generate_ad_events(count, seed=3, per_second=per_second)):
        kinds = ("view",) if i < cut else ("view", "click")
        if e["event_type"] in kinds:
            out[(table[e["ad_id"]], e["event_time"] - e["event_time"] % 10_000)] += 1
    return out


def test_swap_counts_equal_a_count_by_hand_at_every_cut():
    for cut in (0, 1, 2345, 5000, 9999, 12000):
        assert reference_swap_counts(12000, cut, seed=3, per_second=500) == by_hand(12000, cut, 500)


def test_no_swap_is_the_views_reference_and_counts_rise_after_a_swap():
    views = reference_window_counts(12000, 3, per_second=500)
    assert reference_swap_counts(12000, 12000, seed=3, per_second=500) == views
    both = per_window(reference_swap_counts(12000, 0, seed=3, per_second=500))
    lo = per_window(views)
    assert list(lo) == [START_MS + k * 10_000 for k in range(3)]  # 5,000 events per window
    assert all(1.7 < both[w] / lo[w] < 2.3 for w in lo)  # views and clicks are a third each


def test_per_window_sums_campaigns():
    assert per_window({("a", 10): 2, ("b", 10): 3, ("a", 0): 1}) == {0: 1, 10: 5}
