"""The live-debug benchmark's tables: three watchers paired per round, what each saw."""

from __future__ import annotations

import pytest

from benchmarks.live_debug_report import (
    APP,
    FULL,
    SAMPLED,
    VARIANTS,
    copies,
    copies_table,
    emitted_between,
    round_orders,
    rounds_table,
    table5,
)


def test_every_variant_goes_first_in_turn() -> None:
    orders = round_orders(4)
    assert [o[0] for o in orders] == [FULL, SAMPLED, APP, FULL]
    assert all(sorted(o) == sorted(VARIANTS) for o in orders)


def test_emitted_between_reads_the_marks_inside_the_stretch() -> None:
    marks = [[t * 0.5, 1000 * t, 0, 0.0] for t in range(20)]  # 2000 tuples/s
    assert emitted_between(marks, 1.0, 5.0) == 8000
    assert emitted_between(marks, 100.0, 200.0) is None


def test_copies_of_a_mirror_and_of_the_app_copy() -> None:
    mirror = {
        "copies_seen": 2000, "switch_copied": 20, "switch_sampled": 980, "switch_dropped": 1,
        "ring_dropped": 0, "frames": 20, "lost_copies": 980,
    }  # fmt: skip
    got = copies(mirror, 100_000)
    assert got["reached"] == 2000 and got["coverage"] == pytest.approx(0.02)
    assert got["watched_emitted"] == 100_000
    assert (got["meter_dropped"], got["queue_dropped"], got["ring_dropped"]) == (980, 1, 0)
    assert got["drop_unit"] == "frames"
    app = copies({"copies_sent": 1000, "copies_seen": 990}, 1000)
    assert (app["queue_dropped"], app["meter_dropped"], app["drop_unit"]) == (10, 0, "tuples")
    assert app["coverage"] == pytest.approx(0.99)
    assert copies({"copies_seen": None}, None)["coverage"] is None


def test_tables_put_the_three_watchers_side_by_side() -> None:
    def run(ratio: float, seen: int, meter: int) -> dict:
        consumer = {
            "copies_seen": seen, "switch_copied": 1, "switch_sampled": meter,
            "frames": seen // 100, "lost_copies": meter,
        }  # fmt: skip
        return {
            "attached_over_before": ratio,
            "copies": copies(consumer, 1000),
            "consumer_cpu_s": 2.0,
            "serializations_per_tuple_attached": 1.0,
            "attach_latency_s": 0.5,
        }

    per = {
        FULL: [run(0.9, 1000, 0), run(0.8, 900, 0)],
        SAMPLED: [run(1.0, 100, 99), run(1.0, 300, 97)],
        APP: [{"attached_over_before": 0.5, "copies": copies({"copies_sent": 5,
                                                              "copies_seen": 5}, 5)}] * 2,
    }  # fmt: skip
    rounds = rounds_table(per, round_orders(2))
    assert rounds.columns[2:] == list(VARIANTS)
    assert rounds.rows[0][2:] == ["0.90", "1.00", "0.50"] and rounds.rows[1][2:] == [
        "0.80", "1.00", "0.50"
    ]  # fmt: skip
    rows = {r[0]: r for r in copies_table(per).rows}
    assert rows[FULL][3] == "950" and rows[FULL][4] == "1.0000" and rows[FULL][5] == "0"
    assert rows[SAMPLED][4] == "0.0200"  # 1 frame of 100 read, 3 of 100: median 0.02
    assert rows[SAMPLED][5] == "196" and rows[APP][8] == "tuples"
    assert "(every tuple)" in table5(per).rows[-1][2]
