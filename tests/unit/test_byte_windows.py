"""Credit windows counted in bytes (docs/flow_control.md, "Windows in bytes").

Pure bookkeeping of :class:`typhoon.runtime.links.Sender` (per link) and
:class:`typhoon.runtime.lb_credits.BalancedSender` (per balanced stream): the
receivers report frame counts, the sender turns them into bytes with the frame
lengths it kept.  The properties: at most ``window_bytes`` bytes beyond what a
receiver consumed, except one frame larger than the window, which goes once the
window is fully open; and no deadlock: a receiver that consumed everything it got
always lets the next frame go, whatever its size.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from typhoon.runtime import lb_credits as lb
from typhoon.runtime.links import Sender, window_fits
from typhoon.topology.config import SDN_DEFAULTS

A, B = 1, 2
FULL = 64000  # a full frame (the workers' default MTU)


def frame(n: int) -> bytes:
    return bytes(n)


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("outstanding", "size", "window", "fits"),
    [
        (0, 10, 100, True),
        (90, 10, 100, True),  # exactly fills the window
        (91, 10, 100, False),
        (0, 1000, 100, True),  # larger than the whole window: goes when fully open
        (1, 1000, 100, False),  # ... and only then
        (10**9, 10**6, None, True),  # no byte window: frames only
        (0, 0, 1, True),
    ],
)
def test_window_fits_table(outstanding, size, window, fits):
    assert window_fits(outstanding, size, window) is fits


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1"])
def test_window_bytes_is_checked(bad):
    with pytest.raises(ValueError):
        Sender(8, window_bytes=bad)
    with pytest.raises(ValueError):
        lb.BalancedSender(8, window_bytes=bad)


def test_zero_or_none_means_frames_only():
    for off in (0, None):
        s = Sender(4, window_bytes=off)
        ol = s.unicast(A)
        for _ in range(4):
            assert s.can_send(ol, 0, 10**6)
            s.on_send(ol, frame(10), 0, 0.0, False)
        assert not s.can_send(ol, 0, 1)  # the frame window still binds


# --------------------------------------------------------------------------- per link


def test_full_frames_fill_the_byte_window_and_grants_free_their_bytes():
    s = Sender(128, window_bytes=8 * FULL)
    ol = s.unicast(A)
    n = 0
    while s.can_send(ol, 0, FULL):
        s.on_send(ol, frame(FULL), 0, 0.0, False)
        n += 1
    assert n == 8 and ol.outstanding(ol.members[A]) == 8 * FULL
    assert s.lacking(ol, FULL) == [A] and s.lacking(ol, 0) == []
    s.on_grant(ol, ol.members[A], 3, 5, 1.0)  # three consumed: three frames of room
    assert ol.outstanding(ol.members[A]) == 5 * FULL
    for _ in range(3):
        assert s.can_send(ol, 0, FULL)
        s.on_send(ol, frame(FULL), 0, 1.0, False)
    assert not s.can_send(ol, 0, FULL)


def test_a_frame_larger_than_the_window_waits_for_it_to_open_fully_then_goes():
    s = Sender(128, window_bytes=1000)
    ol = s.unicast(A)
    m = ol.members[A]
    s.on_send(ol, frame(400), 0, 0.0, False)
    assert not s.can_send(ol, 0, 5000)
    s.on_grant(ol, m, 1, 1, 1.0)  # everything consumed: fully open
    assert ol.outstanding(m) == 0 and s.can_send(ol, 0, 5000)
    s.on_send(ol, frame(5000), 0, 1.0, False)
    assert not s.can_send(ol, 0, 1)  # nothing more until it is consumed


def test_asks_for_a_grant_every_quarter_of_the_byte_window():
    s = Sender(128, window_bytes=4 * FULL)  # a quarter: one full frame
    ol = s.unicast(A)
    assert s.wants_ack(ol, 0, FULL)
    assert not s.wants_ack(ol, 0, FULL // 2)
    s.on_send(ol, frame(FULL // 2), 0, 0.0, False)
    assert s.wants_ack(ol, 0, FULL // 2)  # the two halves make a quarter
    s.on_send(ol, frame(FULL // 2), 0, 0.0, True)
    assert not s.wants_ack(ol, 0, 100)


def test_a_multicast_link_is_held_to_its_slowest_member():
    s = Sender(128, window_bytes=3000)
    ol = s.multicast(5)
    s.set_members(ol, [A, B])
    for _ in range(3):
        s.on_send(ol, frame(1000), 0, 0.0, False)
    s.on_grant(ol, ol.members[A], 3, 3, 1.0)
    assert s.lacking(ol, 1000) == [B] and not s.can_send(ol, 0, 1000)
    s.on_grant(ol, ol.members[B], 1, 3, 1.0)
    assert ol.base == 1 and s.can_send(ol, 0, 1000)


def test_full_frames_queue_no_more_tuples_at_a_slow_receiver_than_before():
    """Frames of ~85 small tuples (the fewest reported before full frames, ~270 measured)
    under a 128-frame window let a receiver that consumes nothing hold 128 * 85 tuples;
    full frames of 1,000 under the default byte window fewer (docs/flow_control.md)."""
    before = SDN_DEFAULTS.window * 85
    s = Sender(SDN_DEFAULTS.window, window_bytes=SDN_DEFAULTS.window_bytes)
    ol = s.unicast(A)
    tuples = 0
    while s.can_send(ol, 0, FULL):
        s.on_send(ol, frame(FULL), 0, 0.0, False)
        tuples += 1000
    assert 0 < tuples <= before


# --------------------------------------------------------------------------- properties

sizes = st.integers(1, 70000)
windows = st.one_of(st.none(), st.integers(1, 300000))


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(1, 64),
    window_bytes=windows,
    program=st.lists(st.tuples(sizes, st.integers(0, 3), st.booleans()), max_size=80),
    members=st.integers(1, 3),
)
def test_link_bound_and_no_deadlock(window, window_bytes, program, members):
    """Frames of random sizes, receivers that consume a random part of what they got:
    every member's outstanding bytes match the frames it lacks, stay within the window
    (or are one frame), and a member that consumed everything never blocks a frame."""
    s = Sender(window, window_bytes=window_bytes)
    ol = s.multicast(9)
    s.set_members(ol, range(1, members + 1))
    sizes_sent: list[int] = []
    for size, who, catch_up in program:
        if not s.can_send(ol, 0, size):
            # blocked: the receivers consume what they got; then it must go
            for m in ol.members.values():
                s.on_grant(ol, m, ol.next, ol.next, 1.0)
            assert s.can_send(ol, 0, size), (size, window, window_bytes)
        s.on_send(ol, frame(size), 0, 0.0, False)
        sizes_sent.append(size)
        m = ol.members.get(1 + who % members)
        if m is not None and catch_up:
            s.on_grant(ol, m, (m.consumed + ol.next + 1) // 2, ol.next, 1.0)
        for m in ol.members.values():
            out = ol.outstanding(m)
            assert out == sum(sizes_sent[m.consumed :])
            lacking = ol.next - m.consumed
            assert lacking <= window
            assert window_bytes is None or out <= window_bytes or lacking == 1


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(1, 64),
    window_bytes=windows,
    program=st.lists(st.tuples(sizes, st.integers(0, 2), st.booleans()), max_size=80),
)
def test_group_bound_and_no_deadlock(window, window_bytes, program):
    """The same for a balanced stream's group window: the receivers' consumed counts
    free the oldest frames' bytes; fully open, any frame goes."""
    g = lb.BalancedSender(window, window_bytes=window_bytes)
    g.set_members([A, B, 3])
    consumed = dict.fromkeys((A, B, 3), 0)
    got = dict.fromkeys((A, B, 3), 0)
    sizes_sent: list[int] = []
    for size, who, consume in program:
        if not g.can_send(0, size):
            for r in consumed:
                consumed[r] = got[r]
                g.on_grant(r, consumed[r], got[r], 0)
            assert g.inflight() == 0 and g.can_send(0, size), (size, window, window_bytes)
        g.on_send(0, size)
        sizes_sent.append(size)
        r = (A, B, 3)[who]
        got[r] += 1
        if consume:
            consumed[r] = got[r]
            g.on_grant(r, consumed[r], got[r], 0)
        inflight = g.inflight()
        assert g.wire_bytes == sum(sizes_sent[len(sizes_sent) - inflight :])
        assert inflight <= window
        assert window_bytes is None or g.wire_bytes <= window_bytes or inflight == 1
