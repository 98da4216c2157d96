"""``window_aggregate``: event-time windows per key on keyed state (docs/windows.md).

Each key's open windows live in keyed state, so a rescale moves them with the
key and a guarantee checkpoints them.  A window emits ``[key, window_start,
window_end, value]`` once the watermark (``typhoon.runtime.watermarks``) passes
its end, and again for every tuple that comes within ``allowed_lateness_ms``
after that; a tuple too late for every window it falls in goes out on the
stream ``late`` as ``[key, time, time, tuple]`` (the same fields, so one fields
grouping fits both streams).  A tuple whose time field, or the aggregated
field, is not a number is dropped and counted (``window_bad_time``,
``window_bad_value`` in the worker's metrics and the run report).
"""

from __future__ import annotations

from typing import Any, ClassVar

from typhoon.operators.base import Bolt, Context, Emit
from typhoon.operators.windowing import NUMERIC, Windows, WindowSpec, is_time

LATE_STREAM = "late"


def _out_key(k: Any) -> Any:
    return list(k) if type(k) is tuple else k


def _key_fields(key: Any) -> list[str]:
    return [key] if isinstance(key, str) else list(key)


class WatermarkClosed(Bolt):
    """A keyed bolt whose state per key the watermark closes (windows, joins).

    It keeps the highest watermark seen (checkpointed with the counts, so a replay
    never closes anything again for a lower one), closes every key's state when
    the watermark rises and forgets the keys left empty, and sends tuples too late
    for any of it to the stream ``late``.  A subclass says what closing a key's
    state emits (``close_key``) and which counts it checkpoints.
    """

    keyed: ClassVar[bool] = True
    wm: float = float("-inf")
    state: Any

    def close_key(self, k: Any, entry: Any, wm: float, emit: Emit) -> bool:
        """Emit what watermark ``wm`` ends in key ``k``'s state; True while some is left."""
        raise NotImplementedError

    def counts_state(self) -> Any:
        """The counts a checkpoint holds."""
        raise NotImplementedError

    def restore_counts(self, counts: Any) -> None:
        raise NotImplementedError

    def on_watermark(self, wm: float, emit: Emit) -> None:
        """Close every key's state up to the watermark; forget the keys left empty."""
        if wm <= self.wm:
            return
        self.wm = wm
        data = self.state.data
        empty = [k for k, entry in data.items() if not self.close_key(k, entry, wm, emit)]
        for k in empty:
            del data[k]

    def emit_late(self, k: Any, kept: Any, ts: Any, tail: list, emit: Emit) -> None:
        """``[key, ts, ts, *tail]`` to the stream ``late``; the key's state is forgotten
        unless ``kept`` (it still holds something)."""
        if not kept:
            del self.state[k]
        emit([_out_key(k), ts, ts, *tail], LATE_STREAM)

    def snapshot(self) -> Any:
        """The watermark seen and the counts; the state per key is keyed state."""
        return {"wm": None if self.wm == float("-inf") else self.wm, "counts": self.counts_state()}

    def restore(self, state: Any) -> None:
        if not state:
            return
        if state.get("wm") is not None:
            self.wm = state["wm"]
        self.restore_counts(state["counts"])


class WindowAggregate(WatermarkClosed):
    """Tumbling, sliding or session windows per key, with an aggregate over a field."""

    fields: ClassVar[tuple[str, ...]] = ("key", "window_start", "window_end", "value")

    def __init__(
        self,
        key: str | list[str],
        time_field: str,
        size_ms: float | None = None,
        slide_ms: float | None = None,
        gap_ms: float | None = None,
        aggregate: str = "count",
        field: str | None = None,
        allowed_lateness_ms: float = 0,
    ) -> None:
        super().__init__(
            key=key,
            time_field=time_field,
            size_ms=size_ms,
            slide_ms=slide_ms,
            gap_ms=gap_ms,
            aggregate=aggregate,
            field=field,
            allowed_lateness_ms=allowed_lateness_ms,
        )
        self.spec = _spec(self.args)
        problem = self.spec.problem()
        if problem:
            raise ValueError(problem)
        self.windows = Windows(self.spec)
        self.time_field = time_field
        self.field = field
        self.state: Any = {}
        self.key_of: Any = None
        self.ti = 0
        self.fi: int | None = None
        self.bad_time = 0
        self.bad_value = 0
        self.late = 0
        self.fired = 0

    @classmethod
    def key_fields(cls, args: dict[str, Any], src: str) -> list[str]:
        """The fields the windows are kept per: every input must be grouped on them."""
        return _key_fields(args.get("key", []))

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        key = args.get("key")
        if not key or not (
            isinstance(key, str) or (isinstance(key, list) and all(isinstance(k, str) for k in key))
        ):
            raise ValueError("key must be a field name or a list of field names")
        problem = _spec(args).problem()
        if problem:
            raise ValueError(problem)
        named = [("key", k) for k in _key_fields(key)] + [("time_field", args.get("time_field"))]
        aggregate = args.get("aggregate", "count")
        if aggregate != "count":
            if args.get("field") is None:
                raise ValueError(f"aggregate '{aggregate}' needs 'field' (the field it reads)")
            named.append(("field", args["field"]))
        for what, name in named:
            if name not in input_fields:
                have = ", ".join(input_fields) or "no fields"
                raise ValueError(
                    f"{what} '{name}' is not a field the input produces (it produces: {have})"
                )
        return list(cls.fields)

    def open(self, context: Context) -> None:
        super().open(context)
        self.state = context.keyed_state("windows", default=list)
        self.key_of = context.key
        self.ti = context.input_fields.index(self.time_field)
        self.fi = None if self.field is None else context.input_fields.index(self.field)

    def process(self, values: list, emit: Emit) -> None:
        ts = values[self.ti]
        if not is_time(ts):
            self.bad_time += 1
            return
        agg = self.spec.aggregate
        value = None if self.fi is None else values[self.fi]
        if agg in NUMERIC and not is_time(value):
            self.bad_value += 1
            return
        if agg == "distinct" and not _hashable(value):
            self.bad_value += 1
            return
        k = self.key_of(values)
        windows = self.state[k]
        updates = self.windows.add(windows, ts, value, self.wm)
        if updates is None:
            self.late += 1
            self.emit_late(k, windows, ts, [list(values)], emit)
            return
        key = _out_key(k)
        for start, end, v in updates:
            emit([key, start, end, v])

    def close_key(self, k: Any, windows: Any, wm: float, emit: Emit) -> bool:
        """Emit every window the watermark completes; forget those past their lateness."""
        done = self.windows.fire(windows, wm)
        if done:
            key = _out_key(k)
            self.fired += len(done)
            for start, end, v in done:
                emit([key, start, end, v])
        return bool(windows)

    def counts_state(self) -> Any:
        return [self.bad_time, self.bad_value, self.late, self.fired]

    def restore_counts(self, counts: Any) -> None:
        self.bad_time, self.bad_value, self.late, self.fired = counts

    def metrics(self) -> dict[str, Any]:
        return {
            "window_bad_time": self.bad_time,
            "window_bad_value": self.bad_value,
            "window_late": self.late,
            "windows_fired": self.fired,
        }

    def result(self) -> dict[str, Any]:
        return {
            "bad_time": self.bad_time,
            "bad_value": self.bad_value,
            "late": self.late,
            "fired": self.fired,
            "open": sum(len(w) for w in self.state.values()),
        }

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {k: sum(r[k] for r in results) for k in ("bad_time", "bad_value", "late", "fired")}


def _spec(args: dict[str, Any]) -> WindowSpec:
    return WindowSpec(
        args.get("size_ms"),
        args.get("slide_ms"),
        args.get("gap_ms"),
        args.get("aggregate", "count"),
        args.get("allowed_lateness_ms", 0),
    )


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
