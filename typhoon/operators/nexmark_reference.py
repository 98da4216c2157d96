"""What each Nexmark query (topologies/nexmark/) must output, computed directly from the events.

Plain Python over :func:`typhoon.operators.nexmark.events_of`, no operator and no
watermark: the tests run the queries (in-process through every worker's
framework layer, on tcp, on sdn) and compare their sinks with these.  Each
function takes the arguments of the query's nodes as the topology file gives
them, so a test that changes the file's arguments checks what it ran.  Results
are multisets (:func:`canon` makes tuples hashable) or per-window maps, since a
sink sees the workers' outputs interleaved.  The windowed results are exact as
long as no event is late: the generator's disorder within the watermark's
``out_of_order_ms``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from typhoon.operators.nexmark import AUCTION, BID, FIELDS, PERSON, events_of
from typhoon.operators.windowing import window_starts


def canon(x: Any) -> Any:
    """Lists as tuples, all the way down: a tuple a sink got, hashable."""
    return tuple(canon(v) for v in x) if isinstance(x, (list, tuple)) else x


def multiset(rows: list) -> Counter:
    return Counter(canon(r) for r in rows)


def _at(kind: str, name: str) -> int:
    return FIELDS[kind].index(name)


EXPIRES, CATEGORY = _at(AUCTION, "expires"), _at(AUCTION, "category")
SELLER, AUCTION_TIME, PERSON_TIME = (
    _at(AUCTION, "seller"),
    _at(AUCTION, "dateTime"),
    _at(PERSON, "dateTime"),
)


def q0(bids: dict[str, Any]) -> Counter:
    """Every bid, unchanged."""
    return multiset(events_of(BID, bids))


def q1(bids: dict[str, Any], convert: dict[str, Any]) -> Counter:
    """``[auction, bidder, price * multiply + add, dateTime]`` per bid (``map``'s arithmetic)."""
    mul, add = convert.get("multiply", 1), convert.get("add", 0)
    return multiset([[b[0], b[1], b[2] * mul + add, b[5]] for b in events_of(BID, bids)])


def q2(bids: dict[str, Any], select: dict[str, Any]) -> Counter:
    """``[auction, price]`` of the bids whose auction id ``% modulo`` is ``equals``."""
    modulo, equals = select["modulo"], select["equals"]
    return multiset([[b[0], b[2]] for b in events_of(BID, bids) if b[0] % modulo == equals])


def q3(
    persons: dict[str, Any], auctions: dict[str, Any], states: list[str], category: int
) -> Counter:
    """``[seller, person, auction]`` for every auction of ``category`` whose seller is a
    person living in one of ``states``."""
    state_at, cat_at, seller_at = _at(PERSON, "state"), _at(AUCTION, "category"), SELLER
    people: dict[int, list[list]] = {}
    for p in events_of(PERSON, persons):
        if p[state_at] in states:
            people.setdefault(p[0], []).append(p)
    out = []
    for a in events_of(AUCTION, auctions):
        if a[cat_at] == category:
            out += [[a[seller_at], p, a] for p in people.get(a[seller_at], [])]
    return multiset(out)


def bid_windows(
    bids: dict[str, Any], size: int, slide: int, aggregate: str
) -> dict[tuple[int, int, int], int]:
    """``(auction, start, end) -> count`` or ``max`` price of the bids per auction and window."""
    out: dict[tuple[int, int, int], int] = {}
    for b in events_of(BID, bids):
        for s in window_starts(b[5], size, slide):
            w = (b[0], s, s + size)
            if aggregate == "count":
                out[w] = out.get(w, 0) + 1
            else:
                out[w] = max(out.get(w, b[2]), b[2])
    return out


def per_window_max(
    windows: dict[tuple[int, int, int], int], size: int
) -> dict[tuple[int, int, int], int]:
    """The second stage of q5 and q7: per window (keyed on its start, timed by its end, in
    tumbling windows of ``size``) the largest value, as ``(start, w_start, w_end)``."""
    out: dict[tuple[int, int, int], int] = {}
    for (_, start, end), v in windows.items():
        (s,) = window_starts(end, size, size)
        k = (start, s, s + size)
        out[k] = max(out.get(k, v), v)
    return out


def q5(bids: dict[str, Any], count: dict[str, Any], hottest: dict[str, Any]) -> tuple[dict, dict]:
    """Bids per auction per sliding window, and per window the largest of those counts."""
    counts = bid_windows(bids, count["size_ms"], count["slide_ms"], "count")
    return counts, per_window_max(counts, hottest["size_ms"])


def q7(bids: dict[str, Any], per_auction: dict[str, Any], highest: dict[str, Any]) -> dict:
    """The highest bid price per tumbling window."""
    size = per_auction["size_ms"]
    return per_window_max(bid_windows(bids, size, size, "max"), highest["size_ms"])


def q8(persons: dict[str, Any], auctions: dict[str, Any], join: dict[str, Any]) -> Counter:
    """``[id, start, end, person, auction]`` per person and auction they sold, created in
    one window (tumbling, or sliding with ``slide_ms``)."""
    size = join["size_ms"]
    slide = join.get("slide_ms") or size
    people: dict[tuple[int, int], list[list]] = {}
    for p in events_of(PERSON, persons):
        for s in window_starts(p[PERSON_TIME], size, slide):
            people.setdefault((p[0], s), []).append(p)
    out = []
    for a in events_of(AUCTION, auctions):
        for s in window_starts(a[AUCTION_TIME], size, slide):
            out += [[a[SELLER], s, s + size, p, a] for p in people.get((a[SELLER], s), [])]
    return multiset(out)


def closing_prices(auctions: dict[str, Any], bids: dict[str, Any]) -> Counter:
    """``[auction, dateTime, expires, highest price, category]`` per auction that got a bid
    within ``[dateTime, expires)``."""
    best: dict[int, int] = {}
    spans = {a[0]: (a[AUCTION_TIME], a[EXPIRES]) for a in events_of(AUCTION, auctions)}
    for b in events_of(BID, bids):
        span = spans.get(b[0])
        if span is not None and span[0] <= b[5] < span[1]:
            best[b[0]] = max(best.get(b[0], b[2]), b[2])
    return multiset(
        [
            [a[0], a[AUCTION_TIME], a[EXPIRES], best[a[0]], a[CATEGORY]]
            for a in events_of(AUCTION, auctions)
            if a[0] in best
        ]
    )


def q4(
    auctions: dict[str, Any], bids: dict[str, Any], average: dict[str, Any]
) -> tuple[Counter, dict[tuple[int, int, int], float]]:
    """The closing prices, and their average per category in windows of the closing time."""
    closing = closing_prices(auctions, bids)
    size = average["size_ms"]
    slide = average.get("slide_ms") or size
    sums: dict[tuple[int, int, int], list[int]] = {}
    for (_, _, end, price, category), n in closing.items():
        for s in window_starts(end, size, slide):
            acc = sums.setdefault((category, s, s + size), [0, 0])
            acc[0] += price * n
            acc[1] += n
    return closing, {w: total / n for w, (total, n) in sums.items()}


QUERIES = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8")
# each query's sinks: their results compare as a multiset of tuples, or as one value per
# window ([key, start, end, value] rows, the last one of a window counting)
WINDOW_SINKS = {"q4": ("results",), "q5": ("counts", "results"), "q7": ("results",)}


def expected(query: str, args: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What each sink node of ``query`` must hold, from the args of its nodes (by node id,
    as topologies/nexmark/QUERY.yaml names them)."""
    a = args
    if query == "q0":
        return {"results": q0(a["bids"])}
    if query == "q1":
        return {"results": q1(a["bids"], a["convert"])}
    if query == "q2":
        return {"results": q2(a["bids"], a["select"])}
    if query == "q3":
        local, category = a["local"]["values"], a["category"]["equals"]
        return {"results": q3(a["persons"], a["auctions"], local, category)}
    if query == "q4":
        prices, averages = q4(a["auctions"], a["bids"], a["average"])
        return {"prices": prices, "results": averages}
    if query == "q5":
        counts, hottest = q5(a["bids"], a["count"], a["hottest"])
        return {"counts": counts, "results": hottest}
    if query == "q7":
        return {"results": q7(a["bids"], a["per_auction"], a["highest"])}
    if query == "q8":
        return {"results": q8(a["persons"], a["auctions"], a["join"])}
    raise ValueError(f"no Nexmark query {query!r} (there are {', '.join(QUERIES)})")


def observed(query: str, sink: str, rows: list[list]) -> Any:
    """A sink's tuples in the form :func:`expected` gives for it."""
    if sink in WINDOW_SINKS.get(query, ()):
        return {(key, start, end): value for key, start, end, value in rows}
    return multiset(rows)
