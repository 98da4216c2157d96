"""Flow control of load-balanced frames (typhoon.runtime.lb_credits): pure, no network.

A small in-memory "switch" assigns every frame the sender puts in the group to
one receiver (by weight, like a select group); receivers consume at their own
pace and grant as the transport would.  The property that matters: however
skewed the switch's choice, no receiver ever holds more than one window of
the sender's unconsumed frames, and every frame is eventually accounted for.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from typhoon.runtime.lb_credits import BalancedReceiver, BalancedSender, grant_threshold

W = 32
SENDER, STREAM = 1, 5
R = (11, 12, 13)


def key() -> tuple[int, int]:
    return (SENDER, STREAM)


class Net:
    """One balanced sender, receivers with queues, a switch that picks by weight."""

    def __init__(self, weights=(3, 3, 1), window=W, drop=0.0, seed=1) -> None:
        self.rng = random.Random(seed)
        self.tx = BalancedSender(window)
        self.tx.set_members(R)
        self.rx = {r: BalancedReceiver(grant_threshold(window)) for r in R}
        self.queue = dict.fromkeys(R, 0)  # read off the port, not consumed
        self.weights = weights
        self.drop = drop
        self.now = 0.0
        self.dropped = 0
        self.delivered = dict.fromkeys(R, 0)
        for r in self.tx.needs_reset():
            self.answer(r, self.rx[r].on_probe(key(), 0, self.now))

    def answer(self, r: int, counts) -> None:
        self.tx.on_grant(r, *counts)

    def send(self) -> bool:
        if not self.tx.can_send():
            return False
        self.tx.on_send()
        if self.rng.random() < self.drop:
            self.dropped += 1
            return True
        r = self.rng.choices(R, self.weights)[0]
        self.rx[r].on_receive(key(), self.now)
        self.queue[r] += 1
        self.delivered[r] += 1
        return True

    def consume(self, r: int, n: int = 1) -> None:
        for _ in range(min(n, self.queue[r])):
            self.queue[r] -= 1
            self.rx[r].on_consume(key())

    def grants(self) -> None:
        for r in R:
            for k in self.rx[r].due(self.now):
                self.answer(r, self.rx[r].grant(k, self.now))

    def probe(self, answering=R) -> None:
        probe, targets = self.tx.start_probe(self.now)
        assert set(targets) >= set(answering)
        for r in targets:
            if r in answering:
                self.answer(r, self.rx[r].on_probe(key(), probe, self.now))


def test_window_bounds_what_is_in_flight_then_grants_free_it():
    net = Net()
    sent = 0
    while net.send():
        sent += 1
    assert sent == W and net.tx.inflight() == W
    for r in R:
        net.consume(r, 100)
    net.grants()  # receivers with a few frames left ungranted hold some back ...
    assert net.tx.inflight() < W // 2
    net.probe()  # ... until the sender asks
    assert net.tx.inflight() == 0 and net.tx.can_send()


def test_receivers_grant_after_an_eighth_of_the_window():
    rx = BalancedReceiver(grant_threshold(W), refresh_s=0.1)
    for _ in range(3):
        rx.on_receive(key(), 0.0)
        rx.on_consume(key())
    assert rx.due(0.0) == []
    rx.on_receive(key(), 0.0)
    rx.on_consume(key())
    assert rx.due(0.0) == [key()]
    assert rx.grant(key(), 0.0) == (4, 4, 0)
    rx.on_receive(key(), 0.0)
    rx.on_consume(key())
    assert rx.due(0.01) == []
    assert rx.due(0.2) == [key()]  # refreshed while the sender is active


@settings(max_examples=25, deadline=None)
@given(
    weights=st.tuples(*[st.integers(0, 10)] * 3).filter(any),
    speeds=st.tuples(*[st.integers(1, 5)] * 3),
    seed=st.integers(0, 1000),
)
def test_no_receiver_ever_holds_more_than_a_window_and_nothing_is_lost(weights, speeds, seed):
    net = Net(weights, seed=seed)
    frames = 600
    sent = 0
    for step in range(100_000):
        while sent < frames and net.send():
            sent += 1
            for r in R:
                assert net.queue[r] <= W  # the lossless bound, whatever the switch chose
        for r, speed in zip(R, speeds, strict=True):
            if step % speed == 0:
                net.consume(r)
        net.now += 0.001
        net.grants()
        if sent == frames and net.tx.inflight() == 0:
            break
        if step % 50 == 49:
            net.probe()
    assert sent == frames and net.tx.inflight() == 0
    assert sum(net.delivered.values()) == frames and net.tx.lost == 0


def test_probes_find_frames_the_switch_lost():
    net = Net(drop=0.25, seed=3)
    sent = 0
    for _ in range(200):
        while net.send():
            sent += 1
        for r in R:
            net.consume(r, 100)
        net.grants()
        net.probe()  # two rounds that miss the same frames count them lost
        net.probe()
    assert sent > 1000
    assert net.tx.lost == net.dropped
    assert net.tx.inflight() == 0


def test_one_round_alone_does_not_declare_a_frame_lost():
    """A probe may overtake a balanced frame in the switch: the next round must confirm."""
    net = Net()
    net.tx.on_send()  # in transit: not yet at any receiver
    net.probe()
    assert net.tx.lost == 0
    r = R[0]
    net.rx[r].on_receive(key(), 0.0)  # it arrives after all
    net.queue[r] += 1
    net.consume(r)
    net.probe()
    assert net.tx.lost == 0 and net.tx.inflight() == 0


def test_silent_receiver_is_dead_and_its_frames_are_written_off():
    net = Net(weights=(1, 1, 1))
    while net.send():
        pass
    assert not net.tx.can_send()
    dead = R[2]
    for r in R[:2]:
        net.consume(r, 100)
    net.grants()
    net.probe(answering=R[:2])
    assert net.tx.inflight() == net.queue[dead] > 0
    assert net.tx.mark_unanswered_dead() == [dead]
    assert net.tx.inflight() == 0 and net.tx.can_send()
    assert not net.tx.all_dead()
    # it answers again: alive; from the next round on its unconsumed frames count again
    revived = net.tx.on_grant(dead, *net.rx[dead].grant(key(), 1.0))[1]
    assert revived
    net.probe()
    assert net.tx.lost == 0 and net.tx.inflight() == net.queue[dead]


def test_a_restarted_receiver_takes_its_unconsumed_frames_with_it():
    net = Net(weights=(0, 0, 1))
    while net.send():
        pass
    r = R[2]
    net.consume(r, 10)
    net.grants()
    assert net.tx.inflight() == W - 10
    # new process: its counts start over
    net.rx[r] = BalancedReceiver(grant_threshold(W))
    net.queue[r] = 0
    net.tx.on_grant(r, *net.rx[r].grant(key(), 1.0))
    assert net.tx.inflight() == 0


def test_reset_probe_zeroes_the_receivers_counts_and_is_sent_once():
    rx = BalancedReceiver(4)
    for _ in range(7):
        rx.on_receive(key(), 0.0)
        rx.on_consume(key())
    assert rx.on_probe(key(), 0, 1.0) == (0, 0, 0)
    tx = BalancedSender(W)
    tx.set_members([1, 2])
    assert tx.needs_reset() == [1, 2]
    tx.set_members([1, 2, 3])
    assert tx.needs_reset() == [3] and tx.needs_reset() == []


def test_byte_budget_and_release():
    tx = BalancedSender(W, budget=1000)
    tx.set_members([1])
    tx.on_send(600)
    assert tx.can_send(300) and not tx.can_send(500)
    tx.on_send(300)
    released, _ = tx.on_grant(1, 1, 2, 0)
    assert released == 600 and tx.bytes == 300


def test_probe_ids_skip_zero_and_late_answers_are_ignored():
    tx = BalancedSender(W)
    tx.set_members([1])
    tx.probe_id = (1 << 32) - 1
    pid, targets = tx.start_probe(0.0)
    assert pid == 1 and targets == [1]
    tx.on_send()
    pid2, _ = tx.start_probe(1.0)
    tx.on_grant(1, 0, 0, pid)  # answer to the older round: not a round answer
    assert tx.waiting == {1}
    tx.on_grant(1, 0, 0, pid2)
    assert tx.waiting == set()


@pytest.mark.parametrize("window", [1, 2, 8, 32, 1 << 20])
def test_grant_threshold(window):
    assert 1 <= grant_threshold(window) <= max(1, window // 8)
