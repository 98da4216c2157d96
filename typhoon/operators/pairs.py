"""A two-key workload with tunable locality (seed paper 003, Caneill et al., §5).

``pair_source`` emits ``[a, b, seq, pad]``: ``a`` uniform over ``keys_a`` keys,
and with probability ``locality`` the ``b`` that ``a`` is paired with, else a
uniform ``b``.  With ``fields`` on ``a`` into one node and ``fields`` on ``b``
into the next, hashing sends most correlated pairs across hosts; locality
routing keeps them on one.  Every tuple is a pure function of the seed and its
sequence number, so :func:`expected_counts` gives the exact result of a run.
``count_forward`` counts its input per key and passes each tuple on.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

from typhoon.operators.base import Bolt, Context, Emit
from typhoon.operators.sinks import CountByKey
from typhoon.operators.sources import CountingSpout, _mix

FIELDS = ("a", "b", "seq", "pad")
_SCALE = 1 << 32


def partner(a: int, seed: int, keys_b: int) -> int:
    """The ``b`` key that key ``a`` is correlated with."""
    return _mix(seed * 7_919 + a * 104_729 + 1) % keys_b


def pair_tuple(seed: int, seq: int, keys_a: int, keys_b: int, locality: float, pad: str) -> list:
    """Tuple number ``seq`` of a source with these arguments."""
    r = _mix(seed * 1_000_003 + seq)
    a = (r & 0xFFFFFFFF) % keys_a
    if (r >> 32) < locality * _SCALE:
        b = partner(a, seed, keys_b)
    else:
        b = _mix(r ^ 0x5BD1E995) % keys_b
    return [f"a{a}", f"b{b}", seq, pad]


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}")


class PairSource(CountingSpout):
    """``count`` tuples ``[a, b, seq, pad]`` per worker (worker ``i`` of ``P`` emits
    sequence numbers ``i, i+P, ...``); ``size`` pad characters; ``rate`` tuples/s."""

    fields: ClassVar[tuple[str, ...]] = FIELDS

    def __init__(
        self,
        count: int = 1000,
        keys_a: int = 100,
        keys_b: int = 100,
        locality: float = 0.8,
        seed: int = 1,
        size: int = 16,
        rate: float = 0.0,
    ) -> None:
        _check_int("count", count, 0)
        _check_int("keys_a", keys_a, 1)
        _check_int("keys_b", keys_b, 1)
        _check_int("size", size, 0)
        _check_int("seed", seed, 0)
        if isinstance(locality, bool) or not isinstance(locality, (int, float)):
            raise ValueError("locality must be a number between 0 and 1")
        if not 0.0 <= locality <= 1.0:
            raise ValueError("locality must be a number between 0 and 1")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
            raise ValueError("rate must be a non-negative number")
        super().__init__(
            count=count, keys_a=keys_a, keys_b=keys_b, locality=locality, seed=seed,
            size=size, rate=rate,
        )  # fmt: skip
        self.count, self.keys_a, self.keys_b = count, keys_a, keys_b
        self.locality, self.seed = float(locality), seed
        self.pad = "p" * size
        self.rate = float(rate)
        self.emitted = 0

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        n = min(max_count, self.count - self.emitted)
        p, i = self.parallelism, self.index
        args = (self.keys_a, self.keys_b, self.locality, self.pad)
        for j in range(self.emitted, self.emitted + n):
            emit(pair_tuple(self.seed, j * p + i, *args))
        self.emitted += n
        return self.emitted < self.count


def expected_counts(
    count: int,
    parallelism: int,
    keys_a: int = 100,
    keys_b: int = 100,
    locality: float = 0.8,
    seed: int = 1,
) -> tuple[dict[str, int], dict[str, int]]:
    """Tuples per ``a`` and per ``b`` that ``parallelism`` sources of ``count`` emit."""
    ca: Counter[str] = Counter()
    cb: Counter[str] = Counter()
    for seq in range(count * parallelism):
        a, b, _, _ = pair_tuple(seed, seq, keys_a, keys_b, locality, "")
        ca[a] += 1
        cb[b] += 1
    return dict(ca), dict(cb)


class CountForward(Bolt):
    """Counts tuples per ``key`` field and emits each tuple unchanged.

    The first hop of the paper's chain: stateful on one key, passing tuples on
    to the next node keyed on another.  The counts are per worker; summed over
    the node's workers they are exact whatever the routing did.
    """

    def __init__(self, key: str | None = None) -> None:
        super().__init__(key=key)
        self.key = key
        self.index = 0
        self.counts: dict[Any, int] = {}

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        key = args.get("key")
        if key is None or key not in input_fields:
            raise ValueError(f"count_forward needs 'key', one of the input fields {input_fields}")
        return list(input_fields)

    def open(self, context: Context) -> None:
        super().open(context)
        self.index = context.input_fields.index(self.key)

    def process(self, values: list, emit: Emit) -> None:
        k = values[self.index]
        self.counts[k] = self.counts.get(k, 0) + 1
        emit(values)

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        i, counts = self.index, self.counts
        get = counts.get
        for values in rows:
            k = values[i]
            counts[k] = get(k, 0) + 1
            emit(values)

    def snapshot(self) -> dict[str, Any]:
        return {"counts": dict(self.counts)}

    def restore(self, state: Any) -> None:
        self.counts = dict(state["counts"])

    def result(self) -> dict[str, Any]:
        return {"counts": {str(k): v for k, v in self.counts.items()}}

    merge_results = CountByKey.merge_results  # per-key counts, summed over workers
