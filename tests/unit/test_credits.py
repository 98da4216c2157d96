"""Credit-based flow control bookkeeping (typhoon.runtime.credits): pure, no network."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from typhoon.runtime import credits as cr
from typhoon.runtime.credits import (
    MASK,
    ReceiverCredits,
    SenderCredits,
    byte_threshold,
    diff32,
    truesize,
)

W = 32
A, B, C = 1, 2, 3


def send(s: SenderCredits, dsts, n: int = 1, cost: int = 0) -> int:
    """Send up to ``n`` frames while there is room; how many went out."""
    sent = 0
    while sent < n and s.can_send(dsts, cost):
        s.consume(dsts, cost)
        sent += 1
    return sent


# --------------------------------------------------------------------------- counters


def test_diff32_is_signed_modular_difference():
    assert diff32(5, 3) == 2
    assert diff32(3, 5) == -2
    assert diff32(1, MASK) == 2  # across the wrap
    assert diff32(MASK, 1) == -2
    assert diff32(1 << 31, 0) == -(1 << 31)


@pytest.mark.parametrize("bad", [0, -1, cr.MAX_WINDOW + 1, True, 2.0])
def test_window_is_checked(bad):
    with pytest.raises(ValueError):
        SenderCredits(bad)
    with pytest.raises(ValueError):
        ReceiverCredits(bad)


# --------------------------------------------------------------------------- windows


def test_sender_starts_with_an_implicit_window_then_waits():
    s = SenderCredits(W)
    assert s.available(A) == W
    assert send(s, [A], 100) == W
    assert s.available(A) == 0 and not s.can_send([A])
    assert s.lacking([A, B]) == [A]
    assert s.sent(A) == W


def test_receiver_grants_after_half_a_window():
    r = ReceiverCredits(W)
    for _ in range(W // 2 - 1):
        r.on_receive(A, 0.0)
        r.on_consume(A)
    assert r.due(0.0) == []  # below half; the refresh only fires later
    r.on_receive(A, 0.0)
    r.on_consume(A)
    assert r.due(0.0) == [A]
    assert r.grant(A, 0.0) == W + W // 2
    assert r.due(0.0) == []


def test_a_round_trip_of_credit():
    s, r = SenderCredits(W), ReceiverCredits(W)
    assert send(s, [A], 100) == W
    for _ in range(W // 2):
        r.on_receive(A, 0.0)
        r.on_consume(A)
    (src,) = r.due(0.0)
    s.on_grant(src, r.grant(src, 0.0))
    assert s.available(A) == W // 2
    assert send(s, [A], 100) == W // 2


def test_frames_received_but_not_consumed_earn_no_credit():
    """Back-pressure: a worker that queues input (blocked sending) grants nothing."""
    r = ReceiverCredits(W)
    for _ in range(W):
        r.on_receive(A, 0.0)
    assert r.pending(A) == W
    assert r.due(0.0) == []
    assert r.grant(A, 0.0) == W  # a refresh only repeats the initial window


def test_cumulative_counts_wrap_at_2_32():
    s, r = SenderCredits(W), ReceiverCredits(W)
    start = MASK - 9  # ten frames before the wrap
    s._link(A).sent = start
    s._link(A).grant = (start + W) & MASK
    r._link(A).received = r._link(A).consumed = r._link(A).granted = start
    total = 0
    for _ in range(20):  # 20 windows: well across 2**32
        n = send(s, [A], W)
        assert n == W
        total += n
        for _ in range(n):
            r.on_receive(A, 0.0)
            r.on_consume(A)
        s.on_grant(A, r.grant(A, 0.0))
        assert s.available(A) == W
    assert s.sent(A) == (start + total) & MASK
    assert s.sent(A) < start  # it did wrap


def test_a_lost_credit_frame_is_repaired_by_the_next():
    s, r = SenderCredits(W), ReceiverCredits(W)
    send(s, [A], W)
    for _ in range(W // 2):
        r.on_receive(A, 0.0)
        r.on_consume(A)
    r.grant(A, 0.0)  # lost on the way
    assert s.available(A) == 0
    for _ in range(W // 2):
        r.on_receive(A, 0.0)
        r.on_consume(A)
    s.on_grant(A, r.grant(A, 0.0))  # cumulative: covers the lost one too
    assert s.available(A) == W


def test_refresh_repairs_a_lost_last_grant():
    r = ReceiverCredits(W, refresh_s=0.1, linger_s=1.0)
    for _ in range(W):
        r.on_receive(A, 0.0)
        r.on_consume(A)
    g = r.grant(A, 0.0)  # lost; the sender is stalled and sends nothing more
    assert r.due(0.05) == []
    assert r.due(0.11) == [A]
    assert r.grant(A, 0.11) == g
    assert r.due(0.25) == [A]  # the link had traffic within linger_s: keep refreshing
    r.grant(A, 0.25)
    assert r.due(2.0) == []  # quiet link, nothing consumed since: no more refreshes


# --------------------------------------------------------------------------- one-to-many


def test_a_group_frame_needs_credit_from_every_receiver():
    s = SenderCredits(W)
    assert send(s, [B], W - 3) == W - 3  # B is nearly full from unicast traffic
    assert send(s, [A, B, C], 100) == 3  # the group is limited by its fullest member
    assert s.lacking([A, B, C]) == [B]
    assert [s.available(d) for d in (A, B, C)] == [W - 3, 0, W - 3]  # one credit from each
    s.on_grant(B, W + 1)
    assert s.can_send([A, B, C])


def test_group_frames_are_counted_on_every_link():
    s, r1, r2 = SenderCredits(W), ReceiverCredits(W), ReceiverCredits(W)
    send(s, [A, B], W)
    for r in (r1, r2):
        for _ in range(W):
            r.on_receive(9, 0.0)
            r.on_consume(9)
    s.on_grant(A, r1.grant(9, 0.0))
    assert not s.can_send([A, B])  # B has not granted yet
    s.on_grant(B, r2.grant(9, 0.0))
    assert send(s, [A, B], 100) == W


# --------------------------------------------------------------------------- SYNC


def test_sync_repairs_credit_leaked_by_lost_data_frames():
    s, r = SenderCredits(W), ReceiverCredits(W)
    send(s, [A], W)
    for _ in range(W - 5):  # five frames lost in the switch
        r.on_receive(A, 0.0)
        r.on_consume(A)
    s.on_grant(A, r.grant(A, 0.0))
    assert s.available(A) == W - 5
    assert r.on_sync(A, s.sent(A)) == 5
    assert r.due(0.0) == [A]
    s.on_grant(A, r.grant(A, 0.0))
    assert s.available(A) == W


def test_sync_resynchronizes_a_restarted_receiver():
    s = SenderCredits(W)
    for _ in range(10):
        send(s, [A], W)
        s.on_grant(A, (s.sent(A) + W) & MASK)
    r = ReceiverCredits(W)  # new incarnation: counts from zero
    s.on_grant(A, r.grant(A, 0.0))  # its refresh: below what we sent
    assert s.available(A) == 0
    assert r.on_sync(A, s.sent(A)) == s.sent(A)  # everything before is "lost" to it
    s.on_grant(A, r.grant(A, 0.0))
    assert s.available(A) == W


def test_sync_resynchronizes_a_restarted_sender():
    r = ReceiverCredits(W)
    for _ in range(1000):
        r.on_receive(A, 0.0)
        r.on_consume(A)
    s = SenderCredits(W)  # new incarnation
    s.on_grant(A, r.grant(A, 0.0))  # a stale grant far ahead is worth one window only
    assert s.available(A) == W
    assert s.needs_first_sync(A) and not s.needs_first_sync(A)
    assert r.on_sync(A, s.sent(A)) == -1
    s.on_grant(A, r.grant(A, 0.0))
    assert s.available(A) == W
    send(s, [A], W)
    assert s.available(A) == 0  # and flow control works again


def test_sync_rate_limit_and_dead_links():
    s = SenderCredits(W, budget=10_000, sync_s=0.1)
    s.start_wait([A], 5.0)
    assert not s.sync_due(A, 5.05)
    assert s.sync_due(A, 5.11) and not s.sync_due(A, 5.15)
    send(s, [A, B], 3, cost=1000)
    assert s.port_bytes == 3000
    assert s.mark_dead(A) and not s.mark_dead(A)
    assert s.is_dead(A) and s.holders() == [B]
    assert s.port_bytes == 3000  # B still holds the group frames
    s.consume([A, B], 1000)  # a dead member counts the frame but holds no bytes
    assert s._link(A).bytes == 0 and s.port_bytes == 4000
    assert s.on_grant(A, (s.sent(A) + W) & MASK)  # revived
    assert not s.is_dead(A)


def test_a_request_for_credit_stays_unanswered_until_a_grant():
    s = SenderCredits(W, sync_s=0.1)
    assert s.unanswered_for(A, 5.0) == 0.0  # nothing asked yet
    s.start_wait([A], 5.0)
    assert s.unanswered_for(A, 6.5) == 1.5
    assert s.sync_due(A, 6.5)  # a later SYNC does not restart the silence
    assert s.unanswered_for(A, 7.0) == 2.0
    s.on_grant(A, W)  # any grant answers, even one that adds no room
    assert s.unanswered_for(A, 7.5) == 0.0
    assert s.sync_due(A, 8.0)  # a SYNC is a request too
    assert s.unanswered_for(A, 8.25) == 0.25
    s.start_wait([A], 8.2)  # the oldest unanswered request counts
    assert s.unanswered_for(A, 8.25) == 0.25
    s.mark_dead(A)  # dead: still unanswered until a grant revives it
    assert s.unanswered_for(A, 9.0) == 1.0
    assert s.on_grant(A, W) and s.unanswered_for(A, 9.0) == 0.0


# --------------------------------------------------------------------------- bytes


def test_truesize_matches_the_measured_kernel_charges():
    # measured with a packet socket on a TAP (Linux 6.x): 60 B -> 704, 114 -> 768,
    # 1214 -> 1856, 4014 -> 8448, 9014 -> 12544; the estimate never undershoots
    for length, measured in [(60, 704), (114, 768), (1214, 1856), (4014, 8448), (9014, 12544)]:
        assert measured <= truesize(length) <= measured + 64
    sizes = [truesize(n) for n in range(14, 9015)]
    assert sizes == sorted(sizes)


def test_default_window_of_jumbo_frames_fits_the_socket_buffer():
    jumbo = truesize(9014)
    assert cr.DEFAULT_BUDGET // jumbo == 16  # 16 jumbo frames: 200 KB of 208 KB
    half = byte_threshold(cr.DEFAULT_BUDGET, 9014)
    assert half == cr.DEFAULT_BUDGET // 2
    # a sender blocked by its budget always has at least ``half`` bytes in flight
    assert cr.DEFAULT_BUDGET - jumbo >= half
    assert byte_threshold(None, 9014) is None
    assert byte_threshold(20_000, 9014) == 20_000 - jumbo  # tiny budgets: grant sooner
    assert byte_threshold(1000, 9014) == 1


def test_receiver_grants_after_half_the_bytes():
    r = ReceiverCredits(W, half_bytes=byte_threshold(cr.DEFAULT_BUDGET, 9014))
    jumbo = truesize(9014)
    n = 0
    while not r.due(0.0):
        r.on_receive(A, 0.0)
        r.on_consume(A, 1, jumbo)
        n += 1
    assert n == -(-(cr.DEFAULT_BUDGET // 2) // jumbo) == 9  # not 16 frames
    assert r.grant(A, 0.0) == W + n
    for _ in range(W // 2 - 1):  # small frames: the frame count triggers first
        r.on_receive(A, 0.0)
        r.on_consume(A, 1, truesize(100))
    assert r.due(0.0) == []
    r.on_consume(A, 1, truesize(100))
    assert r.due(0.0) == [A]


def test_budget_blocked_sender_always_gets_a_grant():
    """No deadlock between the sender's byte budget and the receiver's threshold."""
    budget = cr.DEFAULT_BUDGET
    for size in (60, 1214, 4014, 9014, 5000):
        s = SenderCredits(W, budget)
        r = ReceiverCredits(W, byte_threshold(budget, 9014))
        cost = truesize(size)
        n = send(s, [A], 1000, cost)
        assert 0 < n <= W
        for _ in range(n):
            r.on_receive(A, 0.0)
            r.on_consume(A, 1, cost)
        assert r.due(0.0) == [A], size


def test_byte_budget_per_link():
    s = SenderCredits(W, budget=cr.DEFAULT_BUDGET)
    jumbo = truesize(9014)
    n = send(s, [A], 100, cost=jumbo)
    assert n == cr.DEFAULT_BUDGET // jumbo < W  # the bytes bind before the frame window
    assert s.lacking([A], jumbo) == [A]
    small = truesize(100)
    m = send(s, [A], 100, cost=small)  # small frames still fit in what is left
    assert m == (cr.DEFAULT_BUDGET - n * jumbo) // small
    assert n + m < W
    s.on_grant(A, (n + W) & MASK)  # the jumbo frames were consumed
    assert s._link(A).bytes == m * small
    assert send(s, [A], 100, cost=small) == W - m  # now the frame window binds


def test_byte_budget_over_the_whole_port():
    s = SenderCredits(W, budget=10_000)
    assert send(s, [A], 6, cost=1000) == 6
    assert not s.port_full(1000)
    assert send(s, [B], 100, cost=1000) == 4  # the port total is full, not B's link
    assert s.lacking([B], 1000) == [] and s.port_full(1000)
    assert not s.can_send([B], 1000)
    assert sorted(s.holders()) == [A, B]
    s.on_grant(A, (s.sent(A) + W) & MASK)  # A consumed everything
    assert s.port_bytes == 4000
    assert send(s, [B], 100, cost=1000) == 6


def test_a_group_frame_holds_port_bytes_once_until_every_member_grants():
    s = SenderCredits(W, budget=10_000)
    assert send(s, [A, B, C], 100, cost=1000) == 10
    assert s.port_bytes == 10_000 and s._link(A).bytes == 10_000
    s.on_grant(A, (s.sent(A) + W) & MASK)
    s.on_grant(B, (s.sent(B) + W) & MASK)
    assert s.port_bytes == 10_000  # C still holds them
    s.on_grant(C, (s.sent(C) + W - 4) & MASK)  # C consumed 6 of 10
    assert s.port_bytes == 4000


# --------------------------------------------------------------------------- simulation


@settings(max_examples=60, deadline=None)
@given(
    window=st.sampled_from([2, 4, 8, 32]),
    lose_data=st.lists(st.booleans(), min_size=0, max_size=400),
    lose_credit=st.lists(st.booleans(), min_size=0, max_size=400),
    consume_every=st.integers(1, 5),
    budget=st.sampled_from([None, 30_000, cr.DEFAULT_BUDGET]),
    sizes=st.lists(st.sampled_from([60, 1214, 4014, 9014]), min_size=1, max_size=7),
)
def test_lossy_links_never_overflow_and_always_recover(
    window, lose_data, lose_credit, consume_every, budget, sizes
):
    """Frames and credit frames are lost at random (while the loss lists last); the
    receiver consumes slowly.  Frames and bytes in flight never exceed the window and
    the budget, the sender never deadlocks, and every frame not lost is delivered."""
    s = SenderCredits(window, budget)
    r = ReceiverCredits(window, byte_threshold(budget, 9014), refresh_s=0.1)
    queued_bytes: deque = deque()
    to_r: deque = deque()  # ("data",) | ("sync", sent)
    to_s: deque = deque()  # grant values
    queued = 0  # received, not consumed
    delivered = 0
    now = 0.0
    data_losses, credit_losses = iter(lose_data), iter(lose_credit)
    offered = 0
    target = len(lose_data) + len(lose_credit) + 200
    for step in range(20_000):
        now += 0.01
        # sender: one frame per step if it may, else SYNC when due
        if offered < target:
            cost = truesize(sizes[offered % len(sizes)])
            if s.can_send([A], cost):
                s.consume([A], cost)
                offered += 1
                if not next(data_losses, False):
                    to_r.append(("data", cost))
            elif s.sync_due(A, now):
                to_r.append(("sync", s.sent(A)))
        # the network delivers everything in order
        while to_r:
            msg = to_r.popleft()
            if msg[0] == "data":
                r.on_receive(A, now)
                queued += 1
                queued_bytes.append(msg[1])
            else:
                r.on_sync(A, msg[1])
        # in flight (never lost): what the receiver holds unconsumed
        assert queued <= window
        if budget is not None and queued > 1:
            assert sum(queued_bytes) <= budget
        if step % consume_every == 0 and queued:
            queued -= 1
            delivered += 1
            r.on_consume(A, 1, queued_bytes.popleft())
        for src in r.due(now):
            g = r.grant(src, now)
            if not next(credit_losses, False):
                to_s.append(g)
        while to_s:
            s.on_grant(A, to_s.popleft())
        if offered >= target and not queued:
            break
    assert offered == target, "the sender deadlocked"
    lost = sum(lose_data[:offered])
    assert delivered == offered - lost
    # credit leaked by lost frames comes back with the next SYNC
    r.on_sync(A, s.sent(A))
    s.on_grant(A, r.grant(A, now))
    assert s.available(A) == window
