"""Non-additive operators on keyed state: a running count per key and a max-per-key sink.

``running_count`` emits ``[key, n]`` on every tuple, ``n`` being how many
tuples of that key it has seen so far; ``max_by_key`` keeps the largest
``n`` per key.  Chained, the sink's result is the exact count per key only if
every key's count went on from where it was through every rescale: a key
whose new owner started from zero leaves a maximum below the true count, and
summing the workers' results cannot repair it (the Listing-2 flush cannot
either).  That is what makes them the check of keyed-state migration.
``max_and_prev`` keeps, per key, the largest ``value`` so far and the last one, and
emits each tuple with both: every output depends on the key's earlier tuples in
their order, so a tuple lost, replayed twice or restored into the wrong state
changes outputs that a sum over the outputs would not notice (the check of
columnar rollback, tests/runtime/test_columns_kill_tcp.py).
``running_max`` appends the key's running maximum (and, with ``count``, its running
count) to every tuple: state that is not a sum either, the check of a swap in place
that keeps keyed state (docs/reconfiguration.md, "Swapping a node with keyed state").
"""

from __future__ import annotations

from typing import Any, ClassVar

from typhoon.operators.base import Bolt, Context, Emit


def _out_key(k: Any) -> Any:
    return list(k) if type(k) is tuple else k


def _key_str(k: Any) -> str:
    return str(list(k)) if type(k) is tuple else str(k)


def _value_field(args: dict[str, Any], default: str, input_fields: list[str]) -> str:
    """The ``value`` argument (``default`` if absent), which must name an input field."""
    value = args.get("value", default)
    if value not in input_fields:
        raise ValueError(f"value field '{value}' is not one of the input fields {input_fields}")
    return str(value)


class RunningCount(Bolt):
    """Emits ``[key, n]`` for every tuple: the key's running count (keyed state)."""

    fields: ClassVar[tuple[str, ...]] = ("key", "count")
    keyed: ClassVar[bool] = True
    keyed_shape: ClassVar[dict[str, str] | None] = {"counts": "int"}

    def __init__(self) -> None:
        super().__init__()
        self.counts: Any = {}
        self.key_of: Any = None

    def open(self, context: Context) -> None:
        super().open(context)
        self.counts = context.keyed_state("counts", default=0)
        self.key_of = context.key

    def process(self, values: list, emit: Emit) -> None:
        k = self.key_of(values)
        n = self.counts[k] + 1
        self.counts[k] = n
        emit([_out_key(k), n])

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        key_of, counts = self.key_of, self.counts
        data = counts.data
        for values in rows:
            k = key_of(values)
            if k in data:
                n = data[k] = data[k] + 1
            else:
                n = counts[k] = counts[k] + 1  # the first tuple of a key: ownership checked
            emit([_out_key(k), n])

    KEY_LIST_MAX: ClassVar[int] = 10_000

    def result(self) -> dict[str, Any]:
        """How many keys live here, and which (up to ``KEY_LIST_MAX``): where state is."""
        out: dict[str, Any] = {"keys": len(self.counts)}
        if len(self.counts) <= self.KEY_LIST_MAX:
            out["key_list"] = sorted(_key_str(k) for k in self.counts)
        return out

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        """Keys per worker: where the node's keyed state lives."""
        return {"ownership": [r["keys"] for r in results], "keys": sum(r["keys"] for r in results)}


class MaxByKey(Bolt):
    """Sink: the largest ``value`` field seen per key (keyed state).

    ``result`` holds each key's maximum; the node's merged result is their
    union, with ``keys_on_several_workers`` counting keys that more than one
    worker reported (0 when every key lived on exactly one worker).
    """

    keyed: ClassVar[bool] = True
    keyed_shape: ClassVar[dict[str, str] | None] = {"max": "largest value"}

    def __init__(self, value: str = "count") -> None:
        super().__init__(value=value)
        self.value = value
        self.index = 0
        self.maxima: Any = {}
        self.key_of: Any = None
        self.owned: Any = None

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        _value_field(args, "count", input_fields)
        return []

    def open(self, context: Context) -> None:
        super().open(context)
        self.index = context.input_fields.index(self.value)
        self.maxima = context.keyed_state("max")
        self.key_of = context.key
        self.owned = context.keyed.owned

    def process(self, values: list, emit: Emit) -> None:
        k, v = self.key_of(values), values[self.index]
        m = self.maxima.get(k)
        if m is None or v > m:
            self.maxima[k] = v

    def result(self) -> dict[str, Any]:
        return {
            "max": {_key_str(k): v for k, v in self.maxima.items()},
            "keys": len(self.maxima),
            "key_groups": len(self.owned) if self.owned is not None else 0,
        }

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        seen: dict[str, int] = {}
        for r in results:
            for k, v in r["max"].items():
                seen[k] = seen.get(k, 0) + 1
                if k not in out or v > out[k]:
                    out[k] = v
        return {
            "max": out,
            "ownership": [{"keys": r["keys"], "key_groups": r["key_groups"]} for r in results],
            "keys_on_several_workers": sum(1 for n in seen.values() if n > 1),
        }


class RunningMax(Bolt):
    """Every tuple with the key's largest ``value`` so far appended, and with ``count``
    the key's running count: ``[*values, max, count]`` (``count`` null without).

    Both are keyed state (``max``; ``count`` only with ``count: true``), so a swap in
    place from ``count: false`` to ``count: true`` goes on from the maxima and counts
    from the cut (``count`` is a mapping the new logic adds: it starts empty).
    """

    keyed: ClassVar[bool] = True

    def __init__(self, value: str = "value", count: bool = False) -> None:
        if not isinstance(value, str) or not value:
            raise ValueError("value must be a field name")
        if not isinstance(count, bool):
            raise ValueError("count must be true or false")
        super().__init__(value=value, count=count)
        self.value, self.count = value, count
        self.index = 0
        self.maxima: Any = {}
        self.counts: Any = None
        self.key_of: Any = None

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        _value_field(args, "value", input_fields)
        clash = sorted({"max", "count"} & set(input_fields))
        if clash:
            raise ValueError(f"running_max appends 'max' and 'count'; its input has {clash}")
        return [*input_fields, "max", "count"]

    @classmethod
    def state_shape(cls, args: dict[str, Any]) -> dict[str, str]:
        shape = {"max": "largest value"}
        if args.get("count"):
            shape["count"] = "int"
        return shape

    def open(self, context: Context) -> None:
        super().open(context)
        self.index = context.input_fields.index(self.value)
        self.maxima = context.keyed_state("max")
        self.counts = context.keyed_state("count", default=0) if self.count else None
        self.key_of = context.key

    def process(self, values: list, emit: Emit) -> None:
        k, v = self.key_of(values), values[self.index]
        m = self.maxima.get(k)
        if m is None or v > m:
            self.maxima[k] = m = v
        n = None
        if self.counts is not None:
            n = self.counts[k] = self.counts[k] + 1
        emit([*values, m, n])

    def result(self) -> dict[str, Any]:
        return {"keys": len(self.maxima)}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        """Keys per worker: where the node's keyed state lives."""
        return {"ownership": [r["keys"] for r in results], "keys": sum(r["keys"] for r in results)}


class MaxAndPrev(Bolt):
    """Emits each tuple with ``max`` (the largest ``value`` of its key so far, itself
    included) and ``prev`` (its key's previous ``value``, -1 for the first), from keyed
    state ``[max, last]`` per key.  ``result`` holds each key's final max and last value.
    """

    keyed: ClassVar[bool] = True
    keyed_shape: ClassVar[dict[str, str] | None] = {"peaks": "[max, last]"}

    def __init__(self, value: str = "value") -> None:
        super().__init__(value=value)
        self.value = value
        self.index = 0
        self.peaks: Any = {}
        self.key_of: Any = None

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        _value_field(args, "value", input_fields)
        taken = [f for f in ("max", "prev") if f in input_fields]
        if taken:
            raise ValueError(f"max_and_prev adds fields {taken}, which its input already has")
        return [*input_fields, "max", "prev"]

    def open(self, context: Context) -> None:
        super().open(context)
        self.index = context.input_fields.index(self.value)
        self.peaks = context.keyed_state("peaks")
        self.key_of = context.key

    def process(self, values: list, emit: Emit) -> None:
        k, v = self.key_of(values), values[self.index]
        state = self.peaks.get(k)
        if state is None:
            top, prev = v, -1
        else:
            top, prev = max(state[0], v), state[1]
        self.peaks[k] = [top, v]
        emit([*values, top, prev])

    def result(self) -> dict[str, Any]:
        return {
            "max": {_key_str(k): s[0] for k, s in self.peaks.items()},
            "last": {_key_str(k): s[1] for k, s in self.peaks.items()},
        }

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        """The union of the workers' keys; ``keys_on_several_workers`` 0 when each key
        lived on one worker (its max and last then come from that worker alone)."""
        top: dict[str, Any] = {}
        last: dict[str, Any] = {}
        seen: dict[str, int] = {}
        for r in results:
            for k, v in r["max"].items():
                seen[k] = seen.get(k, 0) + 1
                top[k] = v if k not in top else max(top[k], v)
                last[k] = r["last"][k]
        return {
            "max": top,
            "last": last,
            "keys_on_several_workers": sum(1 for n in seen.values() if n > 1),
        }
