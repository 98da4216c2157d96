"""Link bookkeeping (typhoon.runtime.links): sequence numbers, credit, retransmission.

Pure, no network: frames are opaque bytes, time is passed in.  The transport that
drives these classes is tested against a lossy, reordering fake switch in
test_sdn_links.py.
"""

from __future__ import annotations

import math

import pytest

from typhoon.runtime import links as lk
from typhoon.runtime.links import MASK, Receiver, Sender, diff32, unwrap
from typhoon.runtime.truesize import CREDIT_TRUESIZE, MAX_TRUESIZE, truesize

W = 8
A, B, C = 1, 2, 3
T = 0.0


def send(s: Sender, ol: lk.OutLink, n: int = 1, cost: int = 100, now: float = T) -> int:
    """Send up to ``n`` frames while there is room; how many went out."""
    sent = 0
    while sent < n and s.can_send(ol, cost):
        s.on_send(ol, b"f%d" % ol.next, cost, now, marked=False)
        sent += 1
    return sent


# --------------------------------------------------------------------------- counters


def test_diff32_and_unwrap_handle_the_wrap():
    assert diff32(5, 3) == 2 and diff32(3, 5) == -2
    assert diff32(1, MASK) == 2 and diff32(MASK, 1) == -2
    assert diff32(1 << 31, 0) == -(1 << 31)
    assert unwrap(5, 7) == 5
    assert unwrap(MASK, (1 << 32) + 3) == MASK  # the value just below the wrap
    assert unwrap(3, (1 << 32) + 3) == (1 << 32) + 3


@pytest.mark.parametrize("bad", [0, -1, lk.MAX_WINDOW + 1, True, 2.0])
def test_window_is_checked(bad):
    with pytest.raises(ValueError):
        Sender(bad)
    with pytest.raises(ValueError):
        Receiver(bad)


# --------------------------------------------------------------------------- sender


def test_a_link_holds_a_window_of_frames_until_they_are_consumed():
    s = Sender(W)
    ol = s.unicast(A)
    assert send(s, ol, 100) == W
    assert not s.can_send(ol) and s.lacking(ol) == [A]
    assert len(ol.frames) == W and s.port_bytes == W * 100
    m = ol.members[A]
    # received but not consumed: kept no longer for retransmission, still no credit
    s.on_grant(ol, m, 0, 5, 1.0)
    assert not s.can_send(ol) and m.received == 5
    s.on_grant(ol, m, 3, 5, 1.0)
    assert ol.base == 3 and len(ol.frames) == W - 3 and s.port_bytes == (W - 3) * 100
    assert send(s, ol, 100) == 3


def test_a_stale_or_malformed_grant_changes_nothing():
    s = Sender(W)
    ol = s.unicast(A)
    send(s, ol, W)
    m = ol.members[A]
    s.on_grant(ol, m, 4, 6, 1.0)
    s.on_grant(ol, m, 2, 3, 1.0)  # older, overtaken: the counts only grow
    assert (m.consumed, m.received) == (4, 6)
    s.on_grant(ol, m, 6, 5, 1.0)  # consumed > received: malformed
    assert (m.consumed, m.received) == (4, 6)


def test_counts_wrap_at_2_32():
    s = Sender(W)
    ol = s.unicast(A)
    ol.next = ol.base = MASK - 2  # as if 2**32 - 3 frames had gone before
    m = ol.members[A]
    m.consumed = m.received = ol.next
    assert send(s, ol, 100) == W
    s.on_grant(ol, m, (MASK - 2 + 6) & MASK, (MASK - 2 + 6) & MASK, 1.0)
    assert m.consumed == MASK - 2 + 6 and ol.base == m.consumed


def test_nack_sends_the_missing_frames_again_once_per_guard_time():
    s = Sender(W)
    ol = s.unicast(A)
    send(s, ol, 6)
    m = ol.members[A]
    assert s.on_nack(ol, m, 2, 4, 1.0) == range(2, 4)
    assert m.received == 2  # everything before the gap arrived
    assert s.on_nack(ol, m, 2, 4, 1.0 + s.retx_guard_s / 2) == range(0)
    assert s.on_nack(ol, m, 2, 4, 1.0 + s.retx_guard_s) == range(2, 4)
    assert ol.retransmitted == 4
    # "to" garbled or beyond what was sent: everything after "from"
    assert s.on_nack(ol, m, 3, 100, 5.0) == range(3, 6)


def test_resync_resends_from_what_the_member_holds():
    s = Sender(W)
    ol = s.unicast(A)
    send(s, ol, 5)
    m = ol.members[A]
    s.on_grant(ol, m, 1, 2, 1.0)
    m.base_sent = True
    assert s.on_resync(ol, m, 2.0) == range(2, 5) and not m.base_sent


def test_byte_budget_over_all_links():
    s = Sender(W, budget=1000)
    a, b = s.unicast(A), s.unicast(B)
    assert send(s, a, 10, cost=300) == 3
    assert not s.can_send(b, 300) and s.port_full(300)
    assert s.can_send(b, 100)  # a smaller frame still fits
    s.on_grant(a, a.members[A], 2, 3, 1.0)
    assert s.port_bytes == 300 and send(s, b, 10, cost=300) == 2
    assert s.holders() == [A, B]


def test_one_frame_always_fits_an_empty_port():
    s = Sender(W, budget=100)
    ol = s.unicast(A)
    assert send(s, ol, 5, cost=MAX_TRUESIZE) == 1


def test_multicast_frames_wait_for_every_member_and_count_once():
    s = Sender(W, budget=10_000)
    ol = s.multicast(5)
    assert s.set_members(ol, [A, B]) == [A, B]
    assert send(s, ol, 100) == W
    assert s.port_bytes == W * 100  # one write, one cost, whatever the members
    s.on_grant(ol, ol.members[A], W, W, 1.0)
    assert not s.can_send(ol) and s.lacking(ol) == [B]
    s.on_grant(ol, ol.members[B], 2, 2, 1.0)
    assert ol.base == 2 and send(s, ol, 100) == 2


def test_a_member_joins_at_the_next_frame_and_a_leaving_one_blocks_nothing():
    s = Sender(W)
    ol = s.multicast(5)
    s.set_members(ol, [A, B])
    send(s, ol, 4)
    assert s.set_members(ol, [A, C]) == [C]  # B leaves, C joins at frame 4
    c, b = ol.members[C], ol.members[B]
    assert (c.consumed, c.received) == (4, 4) and b.until == 4
    assert s.needs_base(ol) == [ol.members[A], b, c] and s.needs_base(ol) == []
    s.on_grant(ol, ol.members[A], 4, 4, 1.0)
    assert send(s, ol, 100) == W  # B owes nothing past frame 4: it blocks nothing
    assert s.owed_by(B) == [ol]
    s.on_grant(ol, b, 4, 4, 1.0)
    assert B not in ol.members and s.owed_by(B) == []  # it confirmed all it owed
    assert ol.base == 4  # C still holds frames 4..


def test_dead_members_are_written_off_and_a_grant_revives_them():
    s = Sender(W)
    ol = s.multicast(5)
    s.set_members(ol, [A, B])
    send(s, ol, W)
    s.on_grant(ol, ol.members[A], W, W, 1.0)
    assert s.mark_dead(B) and not s.mark_dead(B) and s.is_dead(B)
    assert ol.base == W and s.port_bytes == 0  # nobody alive holds anything
    assert send(s, ol, 3) == 3
    assert s.lost() == {B: W + 3}
    m = ol.members[B]
    assert s.on_grant(ol, m, 1, 1, 2.0)  # it was only hung: revived
    assert not m.dead and not m.base_sent
    assert (m.consumed, m.received) == (ol.base, ol.base)  # it skips what we released
    assert s.lost() == {B: W - 1}


def test_a_resync_from_a_dead_member_revives_it():
    """A receiver cut off before it got anything has no state to grant from: its
    RESYNC (answer to our probe) is the sign of life that brings it back."""
    s = Sender(W)
    ol = s.unicast(B)
    send(s, ol, W)
    assert s.mark_dead(B)
    assert send(s, ol, 2) == 2  # written off while dead
    m = ol.members[B]
    rng = s.on_resync(ol, m, 3.0)
    assert not m.dead and not m.base_sent  # its base goes out next
    assert rng == range(0)  # nothing kept to send again: every frame was released
    assert s.lost() == {B: W + 2}
    assert send(s, ol, 1) == 1 and s.lost() == {B: W + 2}


def test_unanswered_requests_are_timed_from_the_first_one():
    s = Sender(W)
    ol = s.unicast(A)
    send(s, ol, W)
    s.start_wait(ol, [A], 1.0)
    s.probed(ol, 1.5)
    assert s.unanswered_for(A, 3.0) == 2.0
    s.on_grant(ol, ol.members[A], 0, 0, 3.0)  # a busy receiver answers all the same
    assert s.unanswered_for(A, 3.5) == 0.0


def test_probes_are_due_for_unconfirmed_frames_without_progress():
    s = Sender(W, probe_s=0.02)
    ol = s.unicast(A)
    send(s, ol, 2, now=1.0)
    assert s.probes_due(1.01) == []
    assert s.probes_due(1.03) == [ol]
    s.probed(ol, 1.03)
    assert s.probes_due(1.04) == []
    s.on_grant(ol, ol.members[A], 0, 2, 1.05)  # all received: nothing to probe for
    assert s.probes_due(2.0) == []


def test_ack_requests_every_quarter_window_or_quarter_budget():
    s = Sender(8, budget=4000)
    ol = s.unicast(A)
    assert s.mark_every == 2
    assert not s.wants_ack(ol, 100)
    s.on_send(ol, b"x", 100, T, marked=False)
    assert s.wants_ack(ol, 100)  # the second frame since the last mark
    s.on_send(ol, b"x", 100, T, marked=True)
    assert not s.wants_ack(ol, 100) and s.wants_ack(ol, 1000)  # a quarter of the budget


# --------------------------------------------------------------------------- receiver


def test_receiver_delivers_in_order_and_holds_frames_after_a_gap():
    r = Receiver(W)
    il = r.start((A, 0), 0)
    assert r.accept(il, 0, "f0", T) == (["f0"], False)
    assert r.accept(il, 2, "f2", T) == ([], True)
    assert r.accept(il, 3, "f3", T) == ([], True)
    assert r.nack_range(il, T) == (1, 2)
    assert r.nack_range(il, T) is None  # NACKed already
    assert r.nack_range(il, T + r.nack_s) == (1, 2)  # still open: asked again
    assert r.accept(il, 1, "f1", T) == (["f1", "f2", "f3"], False)
    assert r.accept(il, 2, "f2", T) == ([], False) and r.duplicates == 1
    assert r.gaps == 1 and il.expect == 4


def test_frames_far_past_a_window_are_not_kept():
    r = Receiver(W)
    il = r.start((A, 0), 0)
    assert r.accept(il, 2 * W, "far", T) == ([], True)
    assert not il.ooo


def test_sync_asks_for_a_lost_tail():
    r = Receiver(W)
    il = r.start((A, 0), 0)
    r.accept(il, 0, "f0", T)
    il = r.on_sync((A, 0), 3, None, T)
    assert r.nack_range(il, T, end=3, force=True) == (1, 3)
    assert (A, 0) in r.urgent


def test_sync_with_a_base_starts_or_resets_a_link():
    r = Receiver(W)
    with pytest.raises(KeyError):
        r.on_sync((A, 7), 5, None, T)  # no state and no base: the caller RESYNCs
    il = r.on_sync((A, 7), 5, 5, T)  # a member that joined at frame 5
    assert (il.expect, il.consumed) == (5, 5)
    r.accept(il, 5, "f5", T)
    assert r.on_sync((A, 7), 6, 5, T) is il  # the base again: nothing changes
    # the sender restarted (its count is behind ours): start over at its base
    il2 = r.on_sync((A, 7), 0, 0, T)
    assert il2 is not il and (il2.expect, il2.consumed) == (0, 0)


def test_grants_are_due_when_asked_and_refreshed_while_in_use():
    r = Receiver(W, refresh_s=0.1, linger_s=1.0)
    il = r.start((A, 0), 0)
    r.accept(il, 0, "f0", 0.0)
    assert r.due(0.0) == []  # nothing asked, the refresh clock has not run
    il.consumed = 1
    r.urgent.add((A, 0))
    assert r.due(0.01) == [(A, 0)]
    assert r.grant((A, 0), il, 0.01) == (1, 1)
    assert r.due(0.05) == []
    assert r.due(0.2) == [(A, 0)]  # refresh: a lost grant is repaired
    r.grant((A, 0), il, 0.2)
    assert r.due(2.0) == []  # idle and granted: quiet


# --------------------------------------------------------------------------- truesize


@pytest.mark.parametrize(
    "length,tap,veth",
    [(60, 704, 832), (100, 768, 832), (1000, 1664, 2304), (3000, 3712, 4352),
     (5000, 8448, 9024), (9014, 12544, 13120)],
)  # fmt: skip
def test_truesize_bounds_the_measured_kernel_charges(length, tap, veth):
    assert truesize(length) >= max(tap, veth)
    assert truesize(length) <= max(tap, veth) * 1.1 + 64


def test_truesize_is_monotone_and_bounded_by_the_largest_frame():
    sizes = [truesize(n) for n in range(14, 9015)]
    assert sizes == sorted(sizes) and max(sizes) == MAX_TRUESIZE
    assert truesize(32) == CREDIT_TRUESIZE


def test_default_budget_leaves_room_in_the_port_socket():
    from typhoon.runtime.truesize import default_budget

    assert MAX_TRUESIZE <= default_budget() < lk_rmem()


def lk_rmem() -> int:
    from typhoon.runtime.truesize import default_rmem

    return default_rmem()


def test_a_link_with_no_live_member_holds_nothing():
    s = Sender(W)
    ol = s.multicast(1)
    s.set_members(ol, [A])
    s.mark_dead(A)
    s.on_send(ol, b"x", 100, T, marked=False)
    assert s.port_bytes == 0 and not ol.frames and ol.base == ol.next == 1
    assert s.lost() == {A: 1}
    assert math.isinf(ol.members[A].until)
