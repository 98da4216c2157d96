"""The debug worker's decoding of mirror copies: records, filter, sampling, counters."""

from __future__ import annotations

import random

from typhoon import wire
from typhoon.debug.filter import parse
from typhoon.debug.records import MirrorDecoder
from typhoon.runtime.framework import EOS_PAYLOAD
from typhoon.wire import Kind, encode_credit, encode_rows, mac_str, multicast_mac, worker_mac

APP = 9
SPLIT, COUNT0, COUNT1 = 2, 4, 5
WORKERS = {1: ("source", 0), SPLIT: ("split", 0), COUNT0: ("count", 0), COUNT1: ("count", 1)}
FIELDS = {"source": ["sentence"], "split": ["word"], "count": ["key", "count"]}


def decoder(text: str = "", sample: float = 100.0, seed: int = 1) -> MirrorDecoder:
    return MirrorDecoder(APP, WORKERS, FIELDS, parse(text), sample, random.Random(seed))


def frames(dst: int, words: list[str], seq: int = 0, stream: int = 2) -> list[bytes]:
    payloads = [encode_rows([[w] for w in words])]  # one row batch, as a worker sends it
    return wire.pack_frames(
        worker_mac(APP, dst), worker_mac(APP, SPLIT), Kind.DATA, stream, seq, payloads
    )


def feed(d: MirrorDecoder, data: list[bytes]) -> list[dict]:
    return [r for f in data for r in d.feed(f, 1.5)]


def test_records_name_sender_receiver_and_fields():
    d = decoder()
    [r1, r2] = feed(d, frames(COUNT1, ["alpha", "beta"], seq=7))
    assert r1 == {
        "time": 1.5,
        "src": SPLIT,
        "src_label": "split[0]",
        "dst": COUNT1,
        "dst_label": "count[1]",
        "stream": 2,
        "seq": 7,
        "fields": {"word": "alpha"},
        "values": ["alpha"],
    }
    assert r2["fields"] == {"word": "beta"}
    assert d.stats.tuples == d.stats.matched == 2 and d.stats.links == {f"{SPLIT}->{COUNT1}": 1}


def test_filter_on_fields_and_frame_properties():
    d = decoder("word in alpha,gamma or (_dst=4 and word=beta)")
    got = feed(d, frames(COUNT0, ["alpha", "beta", "delta"]) + frames(COUNT1, ["beta", "gamma"]))
    assert [(r["dst"], r["fields"]["word"]) for r in got] == [
        (COUNT0, "alpha"),
        (COUNT0, "beta"),
        (COUNT1, "gamma"),
    ]
    assert d.stats.tuples == 5 and d.stats.matched == 3


def test_sampling_keeps_about_the_asked_share_of_matches():
    d = decoder("word!=skip", sample=25.0, seed=3)
    words = ["w"] * 4000 + ["skip"] * 1000
    batches = [frames(COUNT0, words[i : i + 100], seq=i // 100) for i in range(0, 5000, 100)]
    got = feed(d, [f for b in batches for f in b])
    assert d.stats.matched == 4000
    assert d.stats.sampled_out == 4000 - len(got)
    assert 850 < len(got) < 1150


def test_lost_copies_show_as_sequence_gaps_per_link():
    d = decoder()
    feed(d, frames(COUNT0, ["a"], seq=0) + frames(COUNT0, ["b"], seq=3))  # 1 and 2 lost
    feed(d, frames(COUNT1, ["c"], seq=5) + frames(COUNT1, ["d"], seq=6))  # another link: fine
    feed(d, frames(COUNT0, ["e"], seq=2))  # late: reordered, not lost
    assert d.stats.seq_gaps == 2


def test_end_of_stream_credits_and_segments():
    d = decoder()
    eos = wire.pack_frames(
        worker_mac(APP, COUNT0), worker_mac(APP, SPLIT), Kind.DATA, 0, 1, [EOS_PAYLOAD]
    )
    sync = wire.pack_frames(
        worker_mac(APP, COUNT0), worker_mac(APP, SPLIT), Kind.CREDIT, 1, 0, [encode_credit(3)]
    )
    big = "x" * 20000  # more than one 9000-byte frame: segmented, reassembled
    segs = wire.pack_frames(
        worker_mac(APP, COUNT0), worker_mac(APP, SPLIT), Kind.DATA, 2, 0, [encode_rows([[big]])]
    )
    assert len(segs) == 3
    assert feed(d, eos + sync) == []
    [r] = feed(d, segs)
    assert r["fields"] == {"word": big}
    assert (d.stats.eos, d.stats.other, d.stats.data_frames, d.stats.seq_gaps) == (1, 1, 4, 0)


def test_multicast_and_values_that_json_cannot_hold():
    d = decoder()
    frame = wire.pack_frames(
        multicast_mac(APP, 3),
        worker_mac(APP, SPLIT),
        Kind.DATA,
        3,
        0,
        [encode_rows([[b"\xffraw", {1: float("nan")}]])],
    )[0]
    [r] = d.feed(frame, 0.0)
    assert r["dst"] is None and r["dst_label"] == "group:3"
    assert r["values"] == ["\ufffdraw", {"1": None}]
    assert r["fields"] == {"word": "\ufffdraw"}


def test_frames_that_are_not_ours_are_summarised_by_scapy_unless_filtered():
    other_app = wire.pack_frames(
        worker_mac(APP + 1, 1), worker_mac(APP + 1, 2), Kind.DATA, 1, 0, [encode_rows([[1]])]
    )[0]
    garbage = bytes.fromhex(mac_str(worker_mac(APP, 1)).replace(":", "")) * 2 + b"\x08\x00" + b"x"
    d = decoder()
    records = [d.feed(f, 0.0) for f in (other_app, garbage)]
    assert all(len(r) == 1 and "raw" in r[0] for r in records)
    assert "Typhoon" in records[0][0]["raw"] and "IP" in records[1][0]["raw"]
    assert d.stats.undecodable == 2
    filtered = decoder("word=a")
    assert filtered.feed(garbage, 0.0) == [] and filtered.stats.undecodable == 1


def test_a_frame_copied_before_the_load_balancer_names_its_virtual_address():
    d = decoder()
    [frame] = wire.pack_frames(
        wire.lb_mac(APP, 1, 5), worker_mac(APP, SPLIT), Kind.DATA, 2, 0, [encode_rows([["w"]])]
    )
    [r] = d.feed(frame, 0.0)
    assert (r["dst"], r["dst_label"]) == (None, "lb:1/5")
    assert d.stats.links == {f"{SPLIT}->load_balancer": 1}


def test_unfiltered_sampling_chooses_before_building_records_and_counts_every_tuple():
    d = decoder("", sample=10.0, seed=5)
    words = [f"w{i}" for i in range(5000)]
    batches = [frames(COUNT0, words[i : i + 100], seq=i // 100) for i in range(0, 5000, 100)]
    got = feed(d, [f for b in batches for f in b])
    assert d.stats.tuples == d.stats.matched == 5000
    assert d.stats.sampled_out + len(got) == 5000
    assert 400 < len(got) < 600
    assert all(r["fields"]["word"] in words and r["dst"] == COUNT0 for r in got)
    assert len({r["fields"]["word"] for r in got}) == len(got)  # each chosen tuple once
