"""``interval_join``: each left tuple's own event-time interval, aggregated over the right
tuples of its key that fall in it (docs/nexmark.md; Nexmark q4's closing prices).

A ``left`` tuple (an auction) carries an interval ``[left_time, left_end)``
(its start and its expiry); the ``right`` tuples (bids) with the same key whose
``right_time`` falls in it are folded into an aggregate of their ``field``
(``count``, ``sum``, ``min``, ``max``, ``avg``, as in ``window_aggregate``).  Once
the watermark reaches the interval's end, ``[key, start, end, value, *carry]``
goes out (``carry``: fields of the left tuple to pass on), only when some right
tuple fell in it unless ``emit_empty``; the interval is then gone.  Both sides
are keyed state, so a guarantee checkpoints them and a rescale moves them.

Right tuples wait for left ones that come after them, as long as a left tuple
could still start before them: until the watermark passes their time.  A left
tuple whose interval ended before the watermark, or a right one below the
watermark that falls in no open interval, goes to the stream ``late`` as
``[key, time, time, tuple]``, counted (``window_late``); a time or an interval
that is not numbers, or a value the aggregate cannot take, is counted and dropped.
"""

from __future__ import annotations

from typing import Any, ClassVar

from typhoon.operators.base import Context, Emit
from typhoon.operators.joins import LEFT, RIGHT, JoinInputs, _check_two
from typhoon.operators.windowing import NUMERIC, add, is_time, new_acc, value_of
from typhoon.operators.windows import WatermarkClosed, _out_key

OUT = ("key", "start", "end", "value")
S, E, ACC, N, CARRY = range(5)  # a left interval: [start, end, acc, matches, carried fields]


class IntervalJoin(JoinInputs, WatermarkClosed):
    """Per left tuple, an aggregate of the right tuples of its key within its interval."""

    SIDE_FIELDS: ClassVar[tuple[str, ...]] = ("key", "time")

    def __init__(
        self,
        left: str,
        right: str,
        left_key: str,
        right_key: str,
        left_time: str,
        left_end: str,
        right_time: str,
        aggregate: str = "count",
        field: str | None = None,
        carry: list[str] | None = None,
        emit_empty: bool = False,
    ) -> None:
        super().__init__(
            left=left,
            right=right,
            left_key=left_key,
            right_key=right_key,
            left_time=left_time,
            left_end=left_end,
            right_time=right_time,
            aggregate=aggregate,
            field=field,
            carry=carry,
            emit_empty=emit_empty,
        )
        _check_args(self.args)
        self.agg = aggregate
        self.emit_empty = bool(emit_empty)
        self.input = ""
        self.state: Any = {}
        self.left_at: tuple[int, int, int, list[int]] = (0, 0, 0, [])
        self.right_at: tuple[int, int, int | None] = (0, 0, None)
        self.counts = {"bad": 0, "late": 0, "late_right": 0, "emitted": 0, "unknown_input": 0}

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        _check_args(args)
        return [*OUT, *(args.get("carry") or [])]

    @classmethod
    def check_inputs(cls, args: dict[str, Any], inputs: dict[str, list[str]]) -> None:
        """Both inputs are there with the fields named (key, times, field, carried ones)."""
        super().check_inputs(args, inputs)
        named = [(args.get("left"), "left_end", args.get("left_end"))]
        named += [(args.get("left"), "carry", f) for f in args.get("carry") or []]
        if args.get("field") is not None:
            named.append((args.get("right"), "field", args["field"]))
        for node, what, name in named:
            if name not in inputs[node]:
                have = ", ".join(inputs[node]) or "no fields"
                raise ValueError(f"{what} '{name}' is not a field '{node}' produces ({have})")

    def open(self, context: Context) -> None:
        super().open(context)
        self.state = context.keyed_state("intervals", default=lambda: [[], []])
        lf = context.input_nodes[self.args["left"]]
        rf = context.input_nodes[self.args["right"]]
        a = self.args
        self.left_at = (
            lf.index(a["left_key"]),
            lf.index(a["left_time"]),
            lf.index(a["left_end"]),
            [lf.index(f) for f in a.get("carry") or []],
        )
        field = a.get("field")
        self.right_at = (
            rf.index(a["right_key"]),
            rf.index(a["right_time"]),
            None if field is None else rf.index(field),
        )

    def process(self, values: list, emit: Emit) -> None:
        if self.input == self.args["left"]:
            self._left(values, emit)
        elif self.input == self.args["right"]:
            self._right(values, emit)
        else:
            self.counts["unknown_input"] += 1

    def _left(self, values: list, emit: Emit) -> None:
        ki, si, ei, carry = self.left_at
        s, e = values[si], values[ei]
        if not (is_time(s) and is_time(e)) or e <= s:
            self.counts["bad"] += 1
            return
        k = values[ki]
        sides = self.state[k]
        if e <= self.wm:
            self._late(k, sides, s, values, emit)
            return
        acc, n = new_acc(self.agg), 0
        for t, v in sides[RIGHT]:
            if s <= t < e:
                acc, n = add(self.agg, acc, v), n + 1
        sides[LEFT].append([s, e, acc, n, [values[i] for i in carry]])

    def _right(self, values: list, emit: Emit) -> None:
        ki, ti, fi = self.right_at
        t = values[ti]
        v = None if fi is None else values[fi]
        if not is_time(t) or (self.agg in NUMERIC and not is_time(v)):
            self.counts["bad"] += 1
            return
        k = values[ki]
        sides = self.state[k]
        hit = False
        for w in sides[LEFT]:
            if w[S] <= t < w[E]:
                w[ACC], w[N] = add(self.agg, w[ACC], v), w[N] + 1
                hit = True
        if t >= self.wm:
            sides[RIGHT].append([t, v])  # a left tuple starting at or before t may follow
        else:
            self.counts["late_right"] += 1
            if not hit:
                self._late(k, sides, t, values, emit)

    def _late(self, k: Any, sides: list, t: Any, values: list, emit: Emit) -> None:
        self.counts["late"] += 1
        self.emit_late(k, sides[LEFT] or sides[RIGHT], t, [list(values)], emit)

    def close_key(self, k: Any, sides: Any, wm: float, emit: Emit) -> bool:
        """Emit the intervals the watermark ended; forget right tuples no left can take."""
        lefts, rights = sides
        done = [w for w in lefts if w[E] <= wm]
        if done:
            key = _out_key(k)
            for w in sorted(done, key=lambda w: (w[E], w[S])):
                if w[N] or self.emit_empty:
                    self.counts["emitted"] += 1
                    emit([key, w[S], w[E], value_of(self.agg, w[ACC]), *w[CARRY]])
            lefts[:] = [w for w in lefts if w[E] > wm]
        if any(r[0] < wm for r in rights):
            rights[:] = [r for r in rights if r[0] >= wm]
        return bool(lefts or rights)

    def counts_state(self) -> Any:
        return dict(self.counts)

    def restore_counts(self, counts: Any) -> None:
        self.counts.update(counts)

    def metrics(self) -> dict[str, Any]:
        c = self.counts
        return {
            "window_bad_time": c["bad"],
            "window_late": c["late"],
            "interval_late_right": c["late_right"],
            "intervals_emitted": c["emitted"],
        }

    def result(self) -> dict[str, Any]:
        return {k: self.counts[k] for k in ("bad", "late", "emitted")}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {k: sum(r[k] for r in results) for k in ("bad", "late", "emitted")}


def _check_args(args: dict[str, Any]) -> None:
    agg = args.get("aggregate", "count")
    if agg not in ("count", *NUMERIC):
        raise ValueError(f"aggregate must be count, {', '.join(NUMERIC)}, not {agg!r}")
    if agg != "count" and args.get("field") is None:
        raise ValueError(f"aggregate '{agg}' needs 'field' (the right tuples' field it reads)")
    _check_two(args.get("left"), args.get("right"))
    carry = args.get("carry") or []
    if not isinstance(carry, list) or not all(isinstance(f, str) for f in carry):
        raise ValueError("carry must be a list of field names of the left tuples")
    clash = [f for f in carry if f in OUT]
    if clash or len(set(carry)) != len(carry):
        raise ValueError(f"carry names a field twice or one of {', '.join(OUT)}: {carry}")
