"""OpenFlow cookie layout of Typhoon rules (docs/design.md §3, "cookies").

Every rule Typhoon installs carries a 64-bit cookie saying who owns it and why
it exists, so `ovs-ofctl dump-flows` reads well, the reconciler knows which
rules it may delete, and a whole application (or one worker) can be removed
with a single OpenFlow delete by cookie mask:

    bits 63..56  magic 0x54 ('T'): the rule belongs to Typhoon
    bits 55..40  application id (0 for switch-wide rules such as the default drop)
    bits 39..32  rule kind: RuleKind in bits 38..32, CREDIT_FLAG in bit 39
    bits 31..16  worker: the worker the rule is about (owner of the frame's eth_src)
    bits 15..0   aux: the peer worker (owner of eth_dst) or, for MULTICAST, the stream id

Credit frames (receiver -> sender, flow control) reuse the unicast kinds with
CREDIT_FLAG set, so a credit rule says where on the path it sits as well.

Pure Python: no Ryu import.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

MAGIC = 0x54
MAGIC_SHIFT = 56
APP_SHIFT = 40
KIND_SHIFT = 32
WORKER_SHIFT = 16

CREDIT_FLAG = 0x80
_U16 = 0xFFFF
_KIND_BITS = 0x7F

MAGIC_MASK = 0xFF << MAGIC_SHIFT
APP_MASK = _U16 << APP_SHIFT
KIND_MASK = 0xFF << KIND_SHIFT
WORKER_MASK = _U16 << WORKER_SHIFT
AUX_MASK = _U16
ALL_MASK = (1 << 64) - 1


class RuleKind(IntEnum):
    """Why a rule exists; the values are part of the cookie layout, never renumber."""

    DEFAULT_DROP = 1  # priority 0, one per bridge: fail_mode=secure made explicit
    SPOOF_DROP = 2  # per worker port: frames that match no allowed source end here
    LOCAL = 3  # sender and receiver on the same bridge
    REMOTE_SEND = 4  # sender's bridge: toward the receiver's host
    TRANSIT = 5  # a bridge on the path that holds neither end
    REMOTE_RECV = 6  # receiver's bridge: fabric port -> receiver's port
    MULTICAST = 7  # one-to-many (`all` grouping): local ports + tree children
    TO_CONTROLLER = 8  # worker -> controller address -> OFPP_CONTROLLER
    LB_GROUP = 9  # reserved: load balancer select groups (`sdn` grouping)
    MIRROR = 10  # reserved: live debugger mirror outputs
    DEAD_ADDRESS = 11  # a dead worker's address: counts what still goes there, then drops it


@dataclass(frozen=True)
class Cookie:
    """The parsed fields of a Typhoon cookie."""

    app_id: int
    kind: RuleKind
    worker: int = 0
    aux: int = 0
    credit: bool = False


def _check_u16(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _U16:
        raise ValueError(f"{name} must be an int in 0..{_U16}, got {value!r}")
    return value


def make_cookie(
    app_id: int, kind: RuleKind, worker: int = 0, aux: int = 0, *, credit: bool = False
) -> int:
    """The cookie of a rule of `kind` for application `app_id` (see the module docstring)."""
    kind_byte = int(RuleKind(kind)) | (CREDIT_FLAG if credit else 0)
    return (
        MAGIC << MAGIC_SHIFT
        | _check_u16("app_id", app_id) << APP_SHIFT
        | kind_byte << KIND_SHIFT
        | _check_u16("worker", worker) << WORKER_SHIFT
        | _check_u16("aux", aux)
    )


def is_typhoon(cookie: int) -> bool:
    """True if the rule was installed by Typhoon (the reconciler may delete it)."""
    return (cookie & ALL_MASK) >> MAGIC_SHIFT == MAGIC


def parse_cookie(cookie: int) -> Cookie | None:
    """The fields of a Typhoon cookie; None for anyone else's or an unknown kind."""
    if not is_typhoon(cookie):
        return None
    kind_byte = (cookie & KIND_MASK) >> KIND_SHIFT
    try:
        kind = RuleKind(kind_byte & _KIND_BITS)
    except ValueError:
        return None
    return Cookie(
        app_id=(cookie & APP_MASK) >> APP_SHIFT,
        kind=kind,
        worker=(cookie & WORKER_MASK) >> WORKER_SHIFT,
        aux=cookie & AUX_MASK,
        credit=bool(kind_byte & CREDIT_FLAG),
    )


def typhoon_mask() -> tuple[int, int]:
    """(cookie, mask) selecting every Typhoon rule, e.g. to wipe a bridge."""
    return MAGIC << MAGIC_SHIFT, MAGIC_MASK


def app_mask(app_id: int) -> tuple[int, int]:
    """(cookie, mask) selecting every rule of one application (OpenFlow delete by cookie)."""
    return MAGIC << MAGIC_SHIFT | _check_u16("app_id", app_id) << APP_SHIFT, MAGIC_MASK | APP_MASK


def worker_mask(app_id: int, worker: int) -> tuple[int, int]:
    """(cookie, mask) selecting the rules of `app_id` about frames *from* `worker`.

    Rules about frames *to* it carry it in aux instead (see `peer_mask`); one mask
    cannot select both, so removing a worker by cookie takes two deletes.
    """
    cookie, mask = app_mask(app_id)
    return cookie | _check_u16("worker", worker) << WORKER_SHIFT, mask | WORKER_MASK


def peer_mask(app_id: int, peer: int) -> tuple[int, int]:
    """(cookie, mask) selecting the unicast rules of `app_id` about frames *to* `peer`.

    Also selects MULTICAST rules of stream id `peer`: filter on kind if that matters.
    """
    cookie, mask = app_mask(app_id)
    return cookie | _check_u16("peer", peer), mask | AUX_MASK


def describe(cookie: int) -> str:
    """Human-readable cookie for logs, e.g. 'app 7 REMOTE_SEND credit 3->1'."""
    c = parse_cookie(cookie)
    if c is None:
        return f"foreign {cookie:#018x}"
    credit = " credit" if c.credit else ""
    return f"app {c.app_id} {c.kind.name}{credit} {c.worker}->{c.aux}"
