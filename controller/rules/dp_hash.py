"""Which hash entry of a select group each slot address lands in, and an entry order
that spreads the slots evenly (groups.py lays the workers' runs of buckets over it).

OVS's select group without a selection method hashes a frame with
``OVS_HASH_ALG_SYM_L4``, basis 0; for a non-IP frame that is
``flow_hash_symmetric_l2`` (lib/flow.c): the XOR of the two addresses and the
ethertype, murmur-hashed as three host-order words (lib/hash.h, a build without
SSE4.2).  Measured on OVS 3.1's userspace datapath: it gives every one of a
sender's 256 slot addresses the entry its bucket counters showed (two maps:
other apps, nodes and senders; tests/unit/test_lb_skew.py).  The entries hold 0
to ~10 slots each, so runs of buckets in entry order are a few points off the
shares asked for; in an order whose every prefix holds close to its share of
the slots, they are within about one point.

If the datapath hashes differently (the kernel's, another build), the order is
just some fixed order of the entries: the runs then skew as much as contiguous
ones do on average (measured in the same test), and change as locally.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

from typhoon.wire import ETHERTYPE, LB_SLOTS, lb_mac, worker_mac

_U32 = 0xFFFFFFFF


def _mhash_add(h: int, data: int) -> int:
    if data:
        data = (data * 0xCC9E2D51) & _U32
        data = ((data << 15) | (data >> 17)) & _U32
        h ^= (data * 0x1B873593) & _U32
    h = ((h << 13) | (h >> 19)) & _U32
    return (h * 5 + 0xE6546B64) & _U32


def _mhash_finish(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _U32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _U32
    return h ^ (h >> 16)


def dp_hash(eth_src: bytes, eth_dst: bytes, eth_type: int = ETHERTYPE) -> int:
    """The dp_hash OVS's userspace datapath gives an untagged non-IP frame (module docstring)."""
    if len(eth_src) != 6 or len(eth_dst) != 6:
        raise ValueError("dp_hash takes two 6-byte addresses")
    x = bytes(a ^ b for a, b in zip(eth_src, eth_dst, strict=True))
    words = eth_type.to_bytes(2, "big") + b"\0\0" + x + b"\0\0"
    h = 0
    for i in range(0, 12, 4):
        h = _mhash_add(h, int.from_bytes(words[i : i + 4], "little"))
    return _mhash_finish(h)


@lru_cache(maxsize=256)
def entry_loads(
    app_id: int, node_index: int, senders: tuple[int, ...], entries: int, eth_type: int = ETHERTYPE
) -> tuple[int, ...]:
    """Slot addresses per hash entry, summed over the senders (each takes every slot in turn)."""
    loads = [0] * entries
    for u in senders:
        src = worker_mac(app_id, u)
        for slot in range(LB_SLOTS):
            loads[dp_hash(src, lb_mac(app_id, node_index, slot), eth_type) % entries] += 1
    return tuple(loads)


def entry_order(loads: Sequence[int]) -> list[int]:
    """The entries, each next one the one that brings the running total closest to its share.

    Every prefix of the order then holds about its length's share of the slots,
    so a worker's run of consecutive positions gets about its share of them.
    Ties go to the lower entry: the order is a pure function of the loads.
    """
    if not loads:
        return []
    mean = sum(loads) / len(loads)
    left = list(range(len(loads)))
    order: list[int] = []
    total = 0
    for k in range(1, len(loads) + 1):
        best = min(left, key=lambda e: (abs(total + loads[e] - mean * k), e))
        left.remove(best)
        order.append(best)
        total += loads[best]
    return order


def slot_order(
    app_id: int, node_index: int, senders: Iterable[int], entries: int, eth_type: int = ETHERTYPE
) -> list[int]:
    """``entry_order`` of the slots these senders send to this node (module docstring)."""
    return entry_order(entry_loads(app_id, node_index, tuple(sorted(senders)), entries, eth_type))
