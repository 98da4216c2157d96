"""Cookie layout: round trips, masks that select exactly what they promise."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.rules.cookies import (
    Cookie,
    RuleKind,
    app_mask,
    describe,
    is_typhoon,
    make_cookie,
    parse_cookie,
    peer_mask,
    typhoon_mask,
    worker_mask,
)

u16 = st.integers(0, 0xFFFF)


def selects(mask_pair: tuple[int, int], cookie: int) -> bool:
    """What a switch does with an OpenFlow cookie/cookie_mask filter."""
    value, mask = mask_pair
    return cookie & mask == value & mask


def test_top_byte_is_T_and_fields_are_readable_in_hex():
    cookie = make_cookie(0x1234, RuleKind.LOCAL, worker=0xABCD, aux=0x0102)
    assert cookie == 0x54_1234_03_ABCD_0102
    assert hex(cookie).startswith("0x54")


def test_default_drop_is_app_zero():
    assert make_cookie(0, RuleKind.DEFAULT_DROP) == 0x5400000100000000


@given(app=u16, kind=st.sampled_from(RuleKind), worker=u16, aux=u16, credit=st.booleans())
def test_round_trip(app, kind, worker, aux, credit):
    cookie = make_cookie(app, kind, worker, aux, credit=credit)
    assert 0 <= cookie < 1 << 64
    assert is_typhoon(cookie)
    assert selects(typhoon_mask(), cookie)
    assert parse_cookie(cookie) == Cookie(app, kind, worker, aux, credit)


@given(a=st.tuples(u16, u16, u16), b=st.tuples(u16, u16, u16))
def test_masks_select_exactly_their_app_worker_peer(a, b):
    app, worker, peer = a
    cookie = make_cookie(b[0], RuleKind.REMOTE_SEND, b[1], b[2])
    assert selects(app_mask(app), cookie) == (app == b[0])
    assert selects(worker_mask(app, worker), cookie) == (app == b[0] and worker == b[1])
    assert selects(peer_mask(app, peer), cookie) == (app == b[0] and peer == b[2])


def test_credit_flag_does_not_change_the_kind():
    data = parse_cookie(make_cookie(7, RuleKind.TRANSIT, 1, 2))
    credit = parse_cookie(make_cookie(7, RuleKind.TRANSIT, 1, 2, credit=True))
    assert data.kind == credit.kind == RuleKind.TRANSIT
    assert (data.credit, credit.credit) == (False, True)


@pytest.mark.parametrize("cookie", [0, 0x1234010000000000, 0x7479010000000000, 0x5400007F00000000])
def test_foreign_or_unknown_cookies_are_not_ours(cookie):
    assert parse_cookie(cookie) is None
    assert describe(cookie).startswith("foreign")


def test_foreign_cookie_outside_masks():
    assert not selects(app_mask(1), 0x0001000000000000)
    assert not is_typhoon(0)


@pytest.mark.parametrize(
    "args",
    [(-1, 0, 0), (1 << 16, 0, 0), (0, -1, 0), (0, 1 << 16, 0), (0, 0, 1 << 16), (True, 0, 0)],
)
def test_out_of_range_fields_are_rejected(args):
    app, worker, aux = args
    with pytest.raises(ValueError):
        make_cookie(app, RuleKind.LOCAL, worker, aux)


def test_describe_reads_like_a_rule():
    assert describe(make_cookie(7, RuleKind.REMOTE_SEND, 3, 1, credit=True)) == (
        "app 7 REMOTE_SEND credit 3->1"
    )
