"""Credit windows counted in bytes (docs/flow_control.md, "Windows in bytes").

Pure bookkeeping of :class:`typhoon.runtime.links.Sender` (per link) and
:class:`typhoon.runtime.lb_credits.BalancedSender` (per balanced stream): the
receivers report frame counts, the sender turns them into bytes with the frame
lengths it kept.  The properties: at most ``window_bytes`` bytes beyond what a
receiver consumed, except one frame larger than the window, which goes once the
window is fully open; and no deadlock: a receiver that consumed everything it got
always lets the next frame go, whatever its size.  A link's window follows its
receiver ("Windows that follow the receiver"): what it consumed in the last
``PACE_S``, between ``window_bytes`` and ``window_bytes_max``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from typhoon.runtime import lb_credits as lb
from typhoon.runtime.links import PACE_S, RATE_S, Sender, paced_window, window_fits
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


def fill(s: Sender, ol, now: float, size: int = FULL) -> int:
    """Frames of ``size`` sent until the window is shut; how many."""
    n = 0
    while s.can_send(ol, 0, size):
        s.on_send(ol, frame(size), 0, now, False)
        n += 1
    return n


def test_full_frames_queue_no_more_tuples_at_a_slow_receiver_than_before():
    """Frames of ~85 small tuples (the fewest reported before full frames, ~270 measured)
    under a 128-frame window let a receiver that consumes nothing hold 128 * 85 tuples;
    full frames of 1,000 under the default byte window fewer (docs/flow_control.md)."""
    before = SDN_DEFAULTS.window * 85
    s = Sender(SDN_DEFAULTS.window, window_bytes=SDN_DEFAULTS.window_bytes)
    ol = s.unicast(A)
    tuples = fill(s, ol, 0.0) * 1000
    assert 0 < tuples <= before


# --------------------------------------------------------------------------- paced windows


@pytest.mark.parametrize(
    ("rate", "window"),
    [
        (0.0, 100),  # nothing consumed: the least
        (100 / PACE_S, 100),
        (150 / PACE_S, 150),  # its work for PACE_S
        (10**12, 1000),  # the most
    ],
)
def test_paced_window_table(rate, window):
    assert paced_window(rate, 100, 1000) == window


def run_receiver(s: Sender, ol, rate: float, seconds: float, t0: float = 0.0) -> float:
    """The sender keeps the link's window full of full frames; the receiver consumes
    ``rate`` bytes/s and grants every 10 ms.  Returns the time at the end."""
    m = ol.members[A]
    t, step = t0, 0.01
    budget = 0.0
    while t < t0 + seconds:
        fill(s, ol, t)
        budget += rate * step
        done = m.consumed
        while done < ol.next and ol.position(done + 1) - ol.position(m.consumed) <= budget:
            done += 1
        # (an idle receiver banks no work for later)
        budget = min(budget - (ol.position(done) - ol.position(m.consumed)), rate * step)
        t += step
        s.on_grant(ol, m, done, ol.next, t)
    return t


def test_a_fast_receivers_window_grows_to_the_most_and_a_slow_ones_stays_at_the_least():
    least, most = 8 * FULL, 48 * FULL
    fast, slow = (
        Sender(128, window_bytes=least, window_bytes_max=most),
        Sender(128, window_bytes=least, window_bytes_max=most),
    )
    fl, sl = fast.unicast(A), slow.unicast(A)
    run_receiver(fast, fl, 150e6, 0.5)  # 150 MB/s: 7.5 MB in PACE_S
    run_receiver(slow, sl, 85e3, 0.5)  # the load balancer test's slow worker, ~85 KB/s
    assert fl.members[A].window_bytes == most and fl.mark_len == most // 4
    assert sl.members[A].window_bytes == least
    # the run report says so (the transport's link stats)
    assert fast.stats()["window_peak"] == {str(A): most}
    assert slow.stats()["window_peak"] == {str(A): least}
    # what each may hold unconsumed: the most, and the least
    assert fl.outstanding(fl.members[A]) <= most and sl.outstanding(sl.members[A]) <= least
    assert fl.outstanding(fl.members[A]) > least


@pytest.mark.parametrize("every", [RATE_S / 2 + 0.01, RATE_S, 0.75, 6.0])
def test_a_receiver_that_takes_its_whole_window_at_once_stays_at_the_least(every):
    """A worker's transport hands the framework every frame it has read at once and
    grants then; a slow operator then works on them for seconds.  The sender sees the
    whole window consumed in one grant: over an interval of at least RATE_S that is at
    most the window * PACE_S / RATE_S (a half), so one burst per interval cannot grow
    the window; only a receiver that consumes more than two windows per RATE_S does."""
    least = 8 * FULL
    s = Sender(128, window_bytes=least, window_bytes_max=48 * FULL)
    ol = s.unicast(A)
    m = ol.members[A]
    t, burst = 0.0, 0.0
    while t < 20 * every:
        fill(s, ol, t)
        t += 0.01
        if t >= burst:  # it takes everything, grants, then works on it for ``every``
            burst = t + every
            s.on_grant(ol, m, ol.next, ol.next, t)
        else:  # refreshes meanwhile
            s.on_grant(ol, m, m.consumed, ol.next, t)
        assert m.window_bytes in (0, least), (t, m.window_bytes)


def test_a_receiver_that_slows_down_gets_the_least_again():
    least, most = 8 * FULL, 48 * FULL
    s = Sender(128, window_bytes=least, window_bytes_max=most)
    ol = s.unicast(A)
    t = run_receiver(s, ol, 150e6, 0.5)
    assert ol.members[A].window_bytes == most
    run_receiver(s, ol, 20 * FULL, 3 * RATE_S, t)  # 64 KB/s of PACE_S: under the least
    assert ol.members[A].window_bytes == least


def test_between_the_least_and_the_most_the_window_is_the_receivers_work_for_pace_s():
    least, most = 2 * FULL, 200 * FULL
    s = Sender(256, window_bytes=least, window_bytes_max=most)
    ol = s.unicast(A)
    rate = 2000 * FULL  # 128 MB/s: 100 frames in PACE_S
    run_receiver(s, ol, rate, 0.5)
    got, want = ol.members[A].window_bytes, rate * PACE_S  # (a given rate, not a measured one)
    assert abs(got - want) <= 0.1 * want, got


def test_no_most_or_no_byte_window_means_no_pacing():
    for least, most in ((8 * FULL, 0), (8 * FULL, None), (None, 48 * FULL), (8 * FULL, FULL)):
        s = Sender(128, window_bytes=least, window_bytes_max=most)
        ol = s.unicast(A)
        run_receiver(s, ol, 150e6, 0.5)
        assert ol.members[A].window_bytes == 0  # the sender's least throughout
        assert least is None or 0 < fill(s, ol, 1.0) <= least // FULL


def test_a_fast_receiver_that_stops_holds_no_more_tuples_than_before_full_frames():
    """The 128-frame window held ~250 tuples of ~110 bytes per frame before full frames
    (the forwarding benchmark, docs/flow_control.md): 32,000 tuples.  A receiver that
    had the most window and then stops consuming holds no more than that."""
    before = SDN_DEFAULTS.window * 250
    s = Sender(SDN_DEFAULTS.window)  # the defaults: 512 KiB to 3 MiB
    ol = s.unicast(A)
    t = run_receiver(s, ol, 150e6, 0.5)
    m = ol.members[A]
    assert m.window_bytes == SDN_DEFAULTS.window_bytes_max
    fill(s, ol, t)
    assert ol.outstanding(m) // 110 <= before
    assert ol.outstanding(m) > SDN_DEFAULTS.window_bytes  # (it did use the larger window)


# --------------------------------------------------------------------------- properties

sizes = st.integers(1, 70000)
windows = st.one_of(st.none(), st.integers(1, 300000))


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(1, 64),
    window_bytes=windows,
    window_bytes_max=windows,
    program=st.lists(
        st.tuples(sizes, st.integers(0, 3), st.booleans(), st.sampled_from([0.0, 0.01, 0.2])),
        max_size=80,
    ),
    members=st.integers(1, 3),
)
def test_link_bound_and_no_deadlock(window, window_bytes, window_bytes_max, program, members):
    """Frames of random sizes, receivers that consume a random part of what they got,
    at random times (so their windows follow their rates): every member's outstanding
    bytes match the frames it lacks, stay within its window when the frame was sent and
    within the most (or are one frame), and a member that consumed everything never
    blocks a frame."""
    s = Sender(window, window_bytes=window_bytes, window_bytes_max=window_bytes_max)
    most = max(window_bytes or 0, window_bytes_max or 0) if window_bytes else None
    ol = s.multicast(9)
    s.set_members(ol, range(1, members + 1))
    sizes_sent: list[int] = []
    now = 0.0
    for size, who, catch_up, dt in program:
        now += dt
        if not s.can_send(ol, 0, size):
            # blocked: the receivers consume what they got; then it must go
            for m in ol.members.values():
                s.on_grant(ol, m, ol.next, ol.next, now)
            assert s.can_send(ol, 0, size), (size, window, window_bytes)
        allowed = {d: m.window_bytes or window_bytes for d, m in ol.members.items()}
        s.on_send(ol, frame(size), 0, now, False)
        sizes_sent.append(size)
        for d, m in ol.members.items():
            out, lacking = ol.outstanding(m), ol.next - m.consumed
            assert lacking <= window
            assert most is None or out <= min(allowed[d], most) or lacking == 1
            assert most is None or (window_bytes or 0) <= allowed[d] <= most
        m = ol.members.get(1 + who % members)
        if m is not None and catch_up:
            s.on_grant(ol, m, (m.consumed + ol.next + 1) // 2, ol.next, now)
        for m in ol.members.values():
            assert ol.outstanding(m) == sum(sizes_sent[m.consumed :])


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
