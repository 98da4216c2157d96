"""``nexmark_source``: the Nexmark auction events (persons, auctions, bids), seeded and replayable.

The event model of Beam's and Flink's Nexmark generators: global event ``n``
is a person, an auction or a bid by ``n % 50`` (proportions 1:3:46); person and
auction ids count up from 1000 as they are created, auctions are sold mostly
by recent ("hot") sellers, bids go mostly to recent hot auctions by hot
bidders, prices are ``round(10 ** (6 u) * 100)`` cents-like numbers.  Every
field is a function of the seed and ``n`` (:func:`nexmark_event`), so a
reference (``typhoon.operators.nexmark_reference``) computes the same events,
and a replay after ``seek`` emits them again.

Event time is the field ``dateTime`` in milliseconds: ``start_ms + n * step_us
/ 1000`` plus a jitter in ``[0, disorder_ms]`` (bounded disorder), so a
watermark ``{time_field: dateTime, out_of_order_ms: disorder_ms}`` never finds
an event late.  A topology node emits one kind (``kind: person | auction |
bid``): a node's tuples have one set of fields (the loader keeps fields per
node), and the three kinds have different ones.  Three spouts with one seed
and ``count`` are one generator: each takes its kind's events of the same
``count`` global events.
"""

from __future__ import annotations

import hashlib
from typing import Any

from typhoon.operators.base import Context, Emit, Spout

PERSON, AUCTION, BID = "person", "auction", "bid"
KINDS = (PERSON, AUCTION, BID)
PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
TOTAL_PROPORTION = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
HOT_SELLER_RATIO = 4
HOT_AUCTION_RATIO = 2
HOT_BIDDER_RATIO = 4
NUM_ACTIVE_PEOPLE = 1000
PERSON_ID_LEAD = 10
NUM_IN_FLIGHT_AUCTIONS = 100
AUCTION_ID_LEAD = 10

FIELDS: dict[str, tuple[str, ...]] = {
    PERSON: ("id", "name", "email", "creditCard", "city", "state", "dateTime"),
    AUCTION: (
        "id",
        "itemName",
        "description",
        "initialBid",
        "reserve",
        "dateTime",
        "expires",
        "seller",
        "category",
    ),
    BID: ("auction", "bidder", "price", "channel", "url", "dateTime"),
}
TIME_FIELD = "dateTime"

FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond")
US_CITIES += ("Seattle", "Kent", "Cheyenne")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
LETTERS = "abcdefghijklmnopqrstuvwxyz"
MASK64 = (1 << 64) - 1


class Draws:
    """The random numbers of one event: a splitmix64 stream from ``blake2b(seed:n)``
    (the same in every process and Python version, unlike ``random``)."""

    __slots__ = ("state",)

    def __init__(self, seed: int, n: int) -> None:
        digest = hashlib.blake2b(f"nexmark:{seed}:{n}".encode(), digest_size=8).digest()
        self.state = int.from_bytes(digest, "big")

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, k: int) -> int:
        return self.next() % k

    def unit(self) -> float:
        return (self.next() >> 11) / float(1 << 53)

    def word(self, length: int) -> str:
        return "".join(LETTERS[self.below(26)] for _ in range(length))

    def price(self) -> int:
        return round(10.0 ** (self.unit() * 6.0) * 100.0)


def kind_of(n: int) -> str:
    """The kind of global event ``n``."""
    offset = n % TOTAL_PROPORTION
    if offset < PERSON_PROPORTION:
        return PERSON
    if offset < PERSON_PROPORTION + AUCTION_PROPORTION:
        return AUCTION
    return BID


def event_number(kind: str, j: int) -> int:
    """The global event number of the ``j``-th event of ``kind`` (0-based)."""
    if kind == PERSON:
        return j * TOTAL_PROPORTION
    if kind == AUCTION:
        epoch, k = divmod(j, AUCTION_PROPORTION)
        return epoch * TOTAL_PROPORTION + PERSON_PROPORTION + k
    epoch, k = divmod(j, BID_PROPORTION)
    return epoch * TOTAL_PROPORTION + PERSON_PROPORTION + AUCTION_PROPORTION + k


def kind_count(kind: str, count: int) -> int:
    """How many of the first ``count`` global events are of ``kind``."""
    epochs, rest = divmod(count, TOTAL_PROPORTION)
    lo = {PERSON: 0, AUCTION: PERSON_PROPORTION, BID: PERSON_PROPORTION + AUCTION_PROPORTION}[kind]
    per = {PERSON: PERSON_PROPORTION, AUCTION: AUCTION_PROPORTION, BID: BID_PROPORTION}[kind]
    return epochs * per + min(per, max(0, rest - lo))


def last_base0_person_id(n: int) -> int:
    """The id (from 0) of the last person created at or before event ``n``."""
    epoch, offset = divmod(n, TOTAL_PROPORTION)
    offset = min(offset, PERSON_PROPORTION - 1)
    return epoch * PERSON_PROPORTION + offset


def last_base0_auction_id(n: int) -> int:
    """The id (from 0) of the last auction created at or before event ``n`` (-1: none)."""
    epoch, offset = divmod(n, TOTAL_PROPORTION)
    if offset < PERSON_PROPORTION:
        epoch -= 1
        offset = AUCTION_PROPORTION - 1
    elif offset >= PERSON_PROPORTION + AUCTION_PROPORTION:
        offset = AUCTION_PROPORTION - 1
    else:
        offset -= PERSON_PROPORTION
    return epoch * AUCTION_PROPORTION + offset


def _next_base0_person_id(n: int, r: Draws) -> int:
    people = last_base0_person_id(n) + 1
    active = min(people, NUM_ACTIVE_PEOPLE)
    return people - active + r.below(active + PERSON_ID_LEAD)


def _next_base0_auction_id(n: int, r: Draws) -> int:
    last = max(last_base0_auction_id(n), 0)
    low = max(last - NUM_IN_FLIGHT_AUCTIONS, 0)
    return low + r.below(last - low + 1 + AUCTION_ID_LEAD)


def event_time(n: int, args: dict[str, Any], r: Draws) -> int:
    base = args.get("start_ms", 0) + n * args.get("step_us", 100) // 1000
    return base + r.below(args.get("disorder_ms", 0) + 1)


def nexmark_event(n: int, args: dict[str, Any]) -> tuple[str, list]:
    """Global event ``n`` of the generator ``args`` as ``(kind, tuple)`` (fields: ``FIELDS``)."""
    r = Draws(args.get("seed", 0), n)
    ts = event_time(n, args, r)
    kind = kind_of(n)
    if kind == PERSON:
        name = f"{FIRST_NAMES[r.below(len(FIRST_NAMES))]} {LAST_NAMES[r.below(len(LAST_NAMES))]}"
        email = f"{r.word(7)}@{r.word(5)}.com"
        card = " ".join(f"{r.below(10_000):04d}" for _ in range(4))
        city = US_CITIES[r.below(len(US_CITIES))]
        state = US_STATES[r.below(len(US_STATES))]
        return kind, [last_base0_person_id(n) + FIRST_PERSON_ID, name, email, card, city, state, ts]
    if kind == AUCTION:
        if r.below(HOT_SELLER_RATIO) > 0:  # a hot seller: one of the latest people
            seller = (last_base0_person_id(n) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO
        else:
            seller = _next_base0_person_id(n, r)
        category = FIRST_CATEGORY_ID + r.below(NUM_CATEGORIES)
        initial = r.price()
        reserve = initial + r.price()
        length = args.get("auction_ms", 10_000)
        expires = ts + length // 2 + r.below(length + 1)
        item, description = r.word(10), r.word(20)
        auction_id = last_base0_auction_id(n) + FIRST_AUCTION_ID
        return kind, [
            auction_id,
            item,
            description,
            initial,
            reserve,
            ts,
            expires,
            seller + FIRST_PERSON_ID,
            category,
        ]
    if r.below(HOT_AUCTION_RATIO) > 0:
        auction = (max(last_base0_auction_id(n), 0) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
    else:
        auction = _next_base0_auction_id(n, r)
    if r.below(HOT_BIDDER_RATIO) > 0:
        bidder = (last_base0_person_id(n) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
    else:
        bidder = _next_base0_person_id(n, r)
    price = r.price()
    channel = CHANNELS[r.below(len(CHANNELS))]
    url = f"https://www.nexmark.com/{r.word(5)}/item.htm?query=1&channel={channel}"
    return kind, [auction + FIRST_AUCTION_ID, bidder + FIRST_PERSON_ID, price, channel, url, ts]


def events_of(kind: str, args: dict[str, Any]) -> list[list]:
    """Every tuple of ``kind`` among the generator's ``count`` events, in emission order."""
    return [
        nexmark_event(event_number(kind, j), args)[1]
        for j in range(kind_count(kind, args["count"]))
    ]


def check_args(args: dict[str, Any]) -> None:
    """A clear ValueError for arguments the generator cannot use."""
    if args.get("kind") not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {args.get('kind')!r}")
    for name in ("count", "seed", "step_us", "disorder_ms", "auction_ms", "start_ms"):
        v = args.get(name, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, not {v!r}")
    if args.get("step_us", 100) < 1 or args.get("auction_ms", 10_000) < 1:
        raise ValueError("step_us and auction_ms must be at least 1")
    rate = args.get("rate", 0.0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
        raise ValueError("rate must be a non-negative number")


class NexmarkSource(Spout):
    """The ``kind`` events among ``count`` global Nexmark events (module docstring).

    Worker ``i`` of ``P`` takes the kind's events ``i, i+P, ...``; ``rate`` is per
    worker in tuples/s (0: unlimited)."""

    def __init__(
        self,
        kind: str,
        count: int,
        seed: int = 0,
        step_us: int = 100,
        disorder_ms: int = 0,
        auction_ms: int = 10_000,
        start_ms: int = 0,
        rate: float = 0.0,
    ) -> None:
        args = dict(
            kind=kind,
            count=count,
            seed=seed,
            step_us=step_us,
            disorder_ms=disorder_ms,
            auction_ms=auction_ms,
            start_ms=start_ms,
            rate=rate,
        )
        check_args(args)
        super().__init__(**args)
        self.kind = kind
        self.total = kind_count(kind, count)
        self.rate = float(rate)
        self.next_j = 0
        self.step = 1
        self.emitted = 0

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        check_args(args)
        return list(FIELDS[args["kind"]])

    def open(self, context: Context) -> None:
        super().open(context)
        self.next_j = context.index
        self.step = max(1, context.parallelism)

    def next_rows(self, emit_rows: Emit, max_count: int) -> bool:
        args, kind = self.args, self.kind
        rows = []
        j = self.next_j
        while j < self.total and len(rows) < max_count:
            rows.append(nexmark_event(event_number(kind, j), args)[1])
            j += self.step
        self.next_j = j
        self.emitted += len(rows)
        if rows:
            emit_rows(rows)
        return j < self.total

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        return self.next_rows(lambda rows: [emit(r) for r in rows], max_count)

    def offset(self) -> dict[str, int]:
        return {"j": self.next_j, "emitted": self.emitted}

    def seek(self, offset: Any) -> None:
        if not isinstance(offset, dict) or not all(
            type(offset.get(k)) is int and offset[k] >= 0 for k in ("j", "emitted")
        ):
            raise ValueError(f"nexmark_source cannot seek to {offset!r}")
        self.next_j, self.emitted = offset["j"], offset["emitted"]

    def result(self) -> dict[str, Any]:
        return {"emitted": self.emitted}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {"emitted": sum(r["emitted"] for r in results)}
