"""The ad-analytics pipeline on built-ins (topologies/ad_analytics_native.yaml) and ``lookup``.

The file is loaded as it is (fewer events, a denser event-time clock and the
campaign table's absolute path), every worker a real
:class:`~typhoon.runtime.framework.Framework` on in-memory ordered links, a
seeded scheduler interleaving them (as tests/unit/test_nexmark_queries.py does):
the per-campaign window counts at the sink must equal
``reference_window_counts``, each window emitted once, none late.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from model_net import SeededNet

from typhoon.operators import resolve_operator
from typhoon.operators.ads import (
    AdEventSource,
    generate_ad_events,
    read_campaign_table,
    reference_window_counts,
    write_campaign_table,
)
from typhoon.operators.base import Context
from typhoon.operators.lookup import Lookup, read_table
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
AD_YAML = ROOT / "topologies" / "ad_analytics_native.yaml"
TABLE = ROOT / "topologies" / "data" / "campaigns.csv"
SMALL = {"count": 6000, "per_second": 200}  # 30 s of event time: three 10 s windows


class Rows(list):
    def __call__(self, values: list, stream: str | None = None) -> None:
        self.append(values)


def run(seed: int) -> SeededNet:
    topo = copy.deepcopy(load_topology(AD_YAML))
    events = topo.nodes["events"]
    events.args.update(SMALL, seed=seed, rate=3000)  # over 2 s of the scheduler's clock
    events.watermark["interval_ms"] = 5  # watermarks go out between the events
    topo.nodes["campaign"].args["table"] = str(TABLE)
    net = SeededNet(topo, seed, batch_size=16)
    net.run(2_000_000)
    return net


@pytest.mark.parametrize("seed", range(3))
def test_window_counts_equal_the_reference(seed):
    net = run(seed)
    rows = net.results("sink")
    got = {(c, start): n for c, start, _end, n in rows}
    assert len(got) == len(rows), "a window was emitted twice"
    assert all(end - start == 10_000 for _c, start, end, _n in rows)
    want = reference_window_counts(SMALL["count"], seed, per_second=SMALL["per_second"])
    assert got == want
    assert len({start for _c, start in want}) == 3 and sum(want.values()) > 1500
    assert net.metric("campaign_counts", "window_late") == 0
    assert net.metric("campaign", "lookup_miss") == 0
    # windows closed by the watermark while events still came, not all at the end
    assert net.metric("events", "watermarks_sent") > 50


def test_the_source_emits_the_event_time_as_a_field_when_asked():
    assert AdEventSource.output_fields({}, []) == ["event", "ts"]
    assert AdEventSource.output_fields({"time_field": "t"}, []) == ["event", "ts", "t"]
    src = AdEventSource(count=5, seed=3, time_field="t")
    src.open(Context("t", "events", 1, 0, 1, []))
    rows = Rows()
    assert src.next_batch(rows, 10) is False
    assert [r[2] for r in rows] == [e["event_time"] for e in generate_ad_events(5, 3)]
    for bad in ("", "ts", 5):
        with pytest.raises(ValueError, match="time_field"):
            AdEventSource(time_field=bad)


def test_lookup_appends_the_value_and_counts_misses(tmp_path: Path):
    table = tmp_path / "c.csv"
    write_campaign_table(table, campaigns=3, ads=2)
    mapping = read_campaign_table(table)
    op = Lookup(table=str(table), field="ad_id", value_column="campaign_id")
    assert Lookup.output_fields(op.args, ["ad_id", "t"]) == ["ad_id", "t", "campaign_id"]
    op.open(Context("t", "campaign", 1, 0, 1, ["ad_id", "t"]))
    rows = Rows()
    ad = next(iter(mapping))
    op.process([ad, 1], rows)
    op.process(["no such ad", 2], rows)
    op.process([None, 3], rows)
    assert rows == [[ad, 1, mapping[ad]]]
    assert op.metrics() == {"lookup_miss": 2} and op.result() == {"miss": 2}
    again = Lookup(**op.args)
    again.restore(op.snapshot())
    assert again.result() == {"miss": 2}
    assert Lookup.merge_results([{"miss": 2}, {"miss": 1}]) == {"miss": 3}
    assert resolve_operator("lookup") is Lookup


def test_lookup_bad_arguments_and_tables(tmp_path: Path):
    with pytest.raises(ValueError, match="value_column"):
        Lookup(table="x.csv", field="ad_id", value_column="")
    with pytest.raises(ValueError, match="not one of the input fields"):
        Lookup.output_fields({"field": "ad", "value_column": "c"}, ["ad_id"])
    with pytest.raises(ValueError, match="already an input field"):
        Lookup.output_fields({"field": "ad_id", "value_column": "ad_id"}, ["ad_id"])
    with pytest.raises(ValueError, match="cannot be read"):
        read_table(tmp_path / "absent.csv", "ad_id", "campaign_id")
    (tmp_path / "t.csv").write_text("ad,campaign\n1,2\n")
    with pytest.raises(ValueError, match="no column 'ad_id'"):
        read_table(tmp_path / "t.csv", "ad_id", "campaign")
    assert read_table(tmp_path / "t.csv", "ad", "campaign") == {"1": "2"}
    op = Lookup(table=str(tmp_path / "absent.csv"), field="ad_id", value_column="campaign_id")
    with pytest.raises(ValueError, match="absent.csv"):
        op.open(Context("t", "campaign", 1, 0, 1, ["ad_id"]))
