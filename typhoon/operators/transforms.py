"""Built-in stateless bolts."""

from __future__ import annotations

import math
import time
from typing import Any, ClassVar

from typhoon.operators.base import Bolt, Context, Emit


def _field_index(fields: list[str], name: str, what: str) -> int:
    if name not in fields:
        raise ValueError(f"{what} field '{name}' is not one of the input fields {fields}")
    return fields.index(name)


def _cost_seconds(cost_us: Any) -> float:
    """A per-tuple service time in seconds from ``cost_us``; a clear error if it is bad."""
    if isinstance(cost_us, bool) or not isinstance(cost_us, (int, float)) or cost_us < 0:
        raise ValueError("cost_us must be a non-negative number")
    return cost_us / 1e6


class ServiceTime:
    """A fixed service time per tuple, paid by sleeping rather than spinning.

    It keeps a running time debt so short sleeps and oversleeping average out:
    a worker's service rate is then set by its arguments, not by how many
    processes share the machine's cores.
    """

    def __init__(self, cost_s: float) -> None:
        self.cost = cost_s
        self.debt = 0.0

    def pay(self) -> None:
        if self.cost <= 0:
            return
        self.debt += self.cost
        if self.debt >= 0.001:  # sleep in steps of at least a millisecond
            t0 = time.perf_counter()
            time.sleep(self.debt)
            self.debt -= time.perf_counter() - t0


class SplitWords(Bolt):
    """``[sentence]`` -> one ``[word]`` per whitespace-separated word.

    Args: ``cost_us`` microseconds of service time per sentence (default 0:
    none), so a scenario can make the split stage its bottleneck, e.g. the
    autoscaler's (paper Fig. 11), without a stage that exists only to be slow.
    """

    fields: ClassVar[tuple[str, ...]] = ("word",)

    def __init__(self, cost_us: float = 0.0) -> None:
        service = ServiceTime(_cost_seconds(cost_us))
        super().__init__(cost_us=cost_us)
        self.service = service

    def process(self, values: list, emit: Emit) -> None:
        self.service.pay()
        for w in values[0].split():
            emit([w])

    def process_rows(self, rows: list[list], emit_rows: Emit) -> None:
        """Every sentence's words, routed as one list (what ``process`` emits, in order)."""
        if self.service.cost > 0:
            for values in rows:
                self.service.pay()
                emit_rows([[w] for w in values[0].split()])
            return
        emit_rows([[w] for values in rows for w in values[0].split()])


class Identity(Bolt):
    """Passes every tuple on unchanged (fields too)."""

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        return list(input_fields)

    def process(self, values: list, emit: Emit) -> None:
        emit(values)

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        for values in rows:
            emit(values)

    def process_columns(self, cols: Any, emit: Emit) -> None:
        """Column blocks passed on as columns (``context.emit_columns``): blocks again
        where the output stream declares columns, else the same rows, counted."""
        emit_columns = getattr(getattr(self, "context", None), "emit_columns", None)
        if emit_columns is None:  # outside a worker
            self.process_batch(cols.rows(), emit)
            return
        emit_columns(cols)


class Filter(Bolt):
    """Passes tuples whose ``field`` equals ``equals`` or is in ``values``.

    With ``modulo`` the test is on ``field % modulo`` (Nexmark q2: ``auction % 123
    == 0``); a value that is not an integer then fails it and is counted
    (``filter_bad_value``), not passed on.
    """

    def __init__(
        self, field: str, equals: Any = None, values: list | None = None, modulo: int | None = None
    ) -> None:
        if not isinstance(field, str):
            raise ValueError("field must be a field name")
        if (equals is None) == (values is None):
            raise ValueError("give exactly one of 'equals' or 'values'")
        if values is not None and not isinstance(values, list):
            raise ValueError("values must be a list")
        if modulo is not None and (
            isinstance(modulo, bool) or not isinstance(modulo, int) or modulo < 1
        ):
            raise ValueError(f"modulo must be a positive integer, not {modulo!r}")
        super().__init__(field=field, equals=equals, values=values, modulo=modulo)
        self.field = field
        self.accept = frozenset([equals] if values is None else values)
        self.modulo = modulo
        self.index = 0
        self.bad_value = 0
        self.residues: list[int] | None = None  # of ``accept`` below ``modulo`` (columns)

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        _field_index(input_fields, args.get("field", ""), "filter")
        return list(input_fields)

    def open(self, context: Context) -> None:
        super().open(context)
        self.index = _field_index(context.input_fields, self.field, "filter")

    def process(self, values: list, emit: Emit) -> None:
        v = values[self.index]
        if self.modulo is not None:
            if type(v) is not int:
                self.bad_value += 1
                return
            v %= self.modulo
        if v in self.accept:
            emit(values)

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        """:meth:`process` on a row batch, the loop's state in locals (a pass in C with
        ``map``/``compress`` measured slower: a slot wrapper call per value)."""
        i, accept, m = self.index, self.accept, self.modulo
        if m is None:
            for values in rows:
                if values[i] in accept:
                    emit(values)
            return
        bad = 0
        try:
            for values in rows:
                v = values[i]
                if type(v) is not int:
                    bad += 1
                elif v % m in accept:
                    emit(values)
        finally:
            self.bad_value += bad

    def process_columns(self, cols: Any, emit: Emit) -> None:
        """:meth:`process` on the columns of column blocks (``typhoon.wire.columns``):
        the test on the field's column (``% modulo`` on an int64 column in numpy),
        then rows built for the passing tuples only."""
        import numpy as np  # (only a worker on a stream of column blocks gets here)

        i, accept, m, n = self.index, self.accept, self.modulo, cols.n
        kind = cols.types[i]
        if m is not None and kind != "int64":
            self.bad_value += n  # no value of such a column is an int (bool is not one)
            return
        if m is not None and m < 1 << 62:
            passing = self.residues
            if passing is None:
                passing = self.residues = [r for r in _residues(accept) if r < m]
            res = cols.cols[i] % m
            if len(passing) <= 4:  # (np.isin costs ~15 µs a call: more than a few compares)
                mask = np.zeros(n, dtype=bool)
                for r in passing:
                    mask |= res == r
            else:
                mask = np.isin(res, passing)
        elif m is None:
            mask = np.fromiter(map(accept.__contains__, cols.column(i)), dtype=bool, count=n)
        else:  # a modulo beyond int64's arithmetic
            self.process_batch(cols.rows(), emit)
            return
        for values in cols.rows_at(np.flatnonzero(mask)):
            emit(values)

    def metrics(self) -> dict[str, Any]:
        return {"filter_bad_value": self.bad_value} if self.modulo is not None else {}


def _residues(accept: frozenset[Any]) -> list[int]:
    """The non-negative ints ``r`` with ``r in accept`` (as Python compares: ``1 == 1.0 ==
    True``), for a test of ``v % modulo in accept`` on an int column."""
    out = set()
    for a in accept:
        if type(a) in (int, bool) or (type(a) is float and math.isfinite(a) and a == int(a)):
            if int(a) >= 0:
                out.add(int(a))
    return sorted(out)


class Busy(Bolt):
    """Passes tuples on after a fixed service time each: a stand-in for real work.

    Args: ``cost_us`` microseconds per tuple; ``slow_index`` and ``slow_factor``
    make the worker with that index (0-based) ``slow_factor`` times slower, for
    load-balancing scenarios with one weak worker; ``emit`` false drops the
    tuples instead of passing them on.  The time is paid like ``ServiceTime`` says.
    """

    def __init__(
        self,
        cost_us: float = 100.0,
        slow_index: int | None = None,
        slow_factor: float = 1.0,
        emit: bool = True,
    ) -> None:
        cost = _cost_seconds(cost_us)
        if not isinstance(slow_factor, (int, float)) or slow_factor <= 0:
            raise ValueError("slow_factor must be a positive number")
        if slow_index is not None and (not isinstance(slow_index, int) or slow_index < 0):
            raise ValueError("slow_index must be a worker index (int >= 0)")
        super().__init__(cost_us=cost_us, slow_index=slow_index, slow_factor=slow_factor, emit=emit)
        self.service = ServiceTime(cost)
        self.slow_index = slow_index
        self.slow_factor = float(slow_factor)
        self.forward = bool(emit)

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        return list(input_fields)

    def open(self, context: Context) -> None:
        super().open(context)
        if context.index == self.slow_index:
            self.service.cost *= self.slow_factor

    def process(self, values: list, emit: Emit) -> None:
        self.service.pay()
        if self.forward:
            emit(values)


class Map(Bolt):
    """Replaces a number field by ``value * multiply + add`` (Nexmark q1's currency
    conversion), rounded to ``round`` decimals when given (``0``: an int).

    ``to`` writes the result to a new field appended to the tuple instead.  A
    value that is not an int or a finite float is counted (``map_bad_value``) and
    the tuple dropped: arithmetic on it would crash or carry garbage on.
    """

    def __init__(
        self,
        field: str,
        multiply: float = 1,
        add: float = 0,
        round: int | None = None,  # noqa: A002 - the argument's name in topology files
        to: str | None = None,
    ) -> None:
        if not isinstance(field, str):
            raise ValueError("field must be a field name")
        for name, v in (("multiply", multiply), ("add", add)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, not {v!r}")
        if round is not None and (isinstance(round, bool) or not isinstance(round, int)):
            raise ValueError(f"round must be a number of decimals (an int), not {round!r}")
        if to is not None and (not isinstance(to, str) or not to):
            raise ValueError("to must be a field name")
        super().__init__(field=field, multiply=multiply, add=add, round=round, to=to)
        self.field, self.multiply, self.add, self.digits, self.to = field, multiply, add, round, to
        self.index = 0
        self.bad_value = 0

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        _field_index(input_fields, args.get("field", ""), "map")
        to = args.get("to")
        if to is None:
            return list(input_fields)
        if to in input_fields:
            raise ValueError(f"to field '{to}' is already an input field (omit 'to' to replace)")
        return [*input_fields, to]

    def open(self, context: Context) -> None:
        super().open(context)
        self.index = _field_index(context.input_fields, self.field, "map")

    def apply(self, v: Any) -> Any:
        """The new value of one field, or None when it is not a number."""
        t = type(v)
        if not (t is int or (t is float and math.isfinite(v))):
            return None
        out = v * self.multiply + self.add
        if self.digits is not None:
            out = round(out, self.digits) if self.digits > 0 else int(round(out))
        return out

    def process(self, values: list, emit: Emit) -> None:
        out = self.apply(values[self.index])
        if out is None:
            self.bad_value += 1
            return
        if self.to is None:
            values = list(values)
            values[self.index] = out
            emit(values)
        else:
            emit([*values, out])

    def metrics(self) -> dict[str, Any]:
        return {"map_bad_value": self.bad_value}
