"""``window_join``: two streams joined on a key within event-time windows (docs/windows.md).

Tuples of the ``left`` node and of the ``right`` node whose keys are equal and
whose times fall in the same tumbling (``size_ms``) or sliding (``size_ms`` +
``slide_ms``) window are emitted as ``[key, window_start, window_end, left,
right]`` (the two whole tuples) once the watermark passes the window's end,
each pair once per window.  Each key's windows are keyed state (they are
checkpointed and move with the key).  A tuple whose every window already
closed goes to the stream ``late`` as ``[key, time, time, left, right]`` with
the other side None; a time that is not a number is counted and dropped.
"""

from __future__ import annotations

from typing import Any, ClassVar

from typhoon.operators.base import Bolt, Context, Emit
from typhoon.operators.windowing import WindowSpec, is_time, window_starts
from typhoon.operators.windows import WatermarkClosed, _out_key

LEFT, RIGHT = 0, 1


class JoinInputs:
    """What every join says of its two inputs, the nodes ``left`` and ``right``: each is
    grouped on its own key field (``left_key``, ``right_key``), the framework tells which
    one a frame came on (``self.input``), and the loader checks that they are the node's
    two inputs and produce the fields ``left_<f>`` and ``right_<f>`` names, for each
    ``f`` of ``SIDE_FIELDS``."""

    sees_input: ClassVar[bool] = True
    SIDE_FIELDS: ClassVar[tuple[str, ...]] = ("key",)

    @classmethod
    def key_fields(cls, args: dict[str, Any], src: str) -> list[str] | None:
        return side_key_fields(args, src)

    @classmethod
    def check_inputs(cls, args: dict[str, Any], inputs: dict[str, list[str]]) -> None:
        _check_sides(args, inputs, cls.SIDE_FIELDS)


class WindowJoin(JoinInputs, WatermarkClosed):
    """Pairs of ``left`` and ``right`` tuples with one key in one window."""

    fields: ClassVar[tuple[str, ...]] = ("key", "window_start", "window_end", "left", "right")
    SIDE_FIELDS: ClassVar[tuple[str, ...]] = ("key", "time")

    def __init__(
        self,
        left: str,
        right: str,
        left_key: str,
        right_key: str,
        left_time: str,
        right_time: str,
        size_ms: float,
        slide_ms: float | None = None,
    ) -> None:
        super().__init__(
            left=left,
            right=right,
            left_key=left_key,
            right_key=right_key,
            left_time=left_time,
            right_time=right_time,
            size_ms=size_ms,
            slide_ms=slide_ms,
        )
        problem = WindowSpec(size_ms, slide_ms).problem()
        if problem:
            raise ValueError(problem)
        _check_two(left, right)
        self.size = size_ms
        self.slide = slide_ms or size_ms
        self.input = ""
        self.state: Any = {}
        # node -> (side, time field index, key field index)
        self.time_at: dict[str, tuple[int, int, int]] = {}
        self.bad_time = 0
        self.late = 0
        self.pairs = 0
        self.unknown_input = 0

    def open(self, context: Context) -> None:
        super().open(context)
        self.state = context.keyed_state("join", default=dict)
        fields = context.input_nodes
        self.time_at = {
            self.args[side]: (
                i,
                fields[self.args[side]].index(self.args[f"{side}_time"]),
                fields[self.args[side]].index(self.args[f"{side}_key"]),
            )
            for i, side in ((LEFT, "left"), (RIGHT, "right"))
        }

    def process(self, values: list, emit: Emit) -> None:
        at = self.time_at.get(self.input)
        if at is None:
            self.unknown_input += 1
            return
        side, ti, ki = at
        ts = values[ti]
        if not is_time(ts):
            self.bad_time += 1
            return
        k = values[ki]  # each side's own key field: the same value hashes to the same group
        windows = self.state[k]
        hit = False
        for s in window_starts(ts, self.size, self.slide):
            end = s + self.size
            if end <= self.wm:
                continue
            hit = True
            w = windows.get(s)
            if w is None:
                w = windows[s] = [end, [], []]
            w[1 + side].append(list(values))
        if not hit:
            self.late += 1
            pair = [list(values), None] if side == LEFT else [None, list(values)]
            self.emit_late(k, windows, ts, pair, emit)

    def close_key(self, k: Any, windows: Any, wm: float, emit: Emit) -> bool:
        """Every pair of each window the watermark closes; the window is then gone."""
        key = _out_key(k)
        for start in sorted(s for s, w in windows.items() if w[0] <= wm):
            end, lefts, rights = windows.pop(start)
            for lv in lefts:
                for rv in rights:
                    emit([key, start, end, lv, rv])
            self.pairs += len(lefts) * len(rights)
        return bool(windows)

    def counts_state(self) -> Any:
        return [self.bad_time, self.late, self.pairs, self.unknown_input]

    def restore_counts(self, counts: Any) -> None:
        self.bad_time, self.late, self.pairs, self.unknown_input = counts

    def metrics(self) -> dict[str, Any]:
        return {
            "window_bad_time": self.bad_time,
            "window_late": self.late,
            "join_pairs": self.pairs,
        }

    def result(self) -> dict[str, Any]:
        return {"bad_time": self.bad_time, "late": self.late, "pairs": self.pairs}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {k: sum(r[k] for r in results) for k in ("bad_time", "late", "pairs")}


class StreamJoin(JoinInputs, Bolt):
    """Every pair of a ``left`` and a ``right`` tuple with equal keys, whenever they met:
    an unwindowed (regular) join, as Nexmark q3's.

    Each key's tuples of both sides stay in keyed state (checkpointed, moved on a
    rescale) for the whole run: a tuple is emitted with every tuple of the other
    side that came before it, and kept for those after it.  So every pair comes
    out once, as ``[key, left, right]``, whatever the order the two inputs
    interleave in; no watermark is needed, and the state grows with the input
    (use it on streams whose keys are filtered to a bounded set, or use
    ``window_join``).
    """

    fields: ClassVar[tuple[str, ...]] = ("key", "left", "right")
    keyed: ClassVar[bool] = True

    def __init__(self, left: str, right: str, left_key: str, right_key: str) -> None:
        super().__init__(left=left, right=right, left_key=left_key, right_key=right_key)
        _check_two(left, right)
        self.input = ""
        self.state: Any = {}
        self.key_at: dict[str, tuple[int, int]] = {}  # node -> (side, key field index)
        self.pairs = 0
        self.kept = 0
        self.unknown_input = 0

    def open(self, context: Context) -> None:
        super().open(context)
        self.state = context.keyed_state("join", default=lambda: [[], []])
        fields = context.input_nodes
        self.key_at = {
            self.args[side]: (i, fields[self.args[side]].index(self.args[f"{side}_key"]))
            for i, side in ((LEFT, "left"), (RIGHT, "right"))
        }

    def process(self, values: list, emit: Emit) -> None:
        at = self.key_at.get(self.input)
        if at is None:
            self.unknown_input += 1
            return
        side, ki = at
        k = values[ki]
        sides = self.state[k]
        row = list(values)
        key = _out_key(k)
        others = sides[1 - side]
        for other in others:
            emit([key, row, other] if side == LEFT else [key, other, row])
        self.pairs += len(others)
        sides[side].append(row)
        self.kept += 1

    def snapshot(self) -> Any:
        return {"counts": [self.pairs, self.kept, self.unknown_input]}

    def restore(self, state: Any) -> None:
        if state:
            self.pairs, self.kept, self.unknown_input = state["counts"]

    def metrics(self) -> dict[str, Any]:
        return {"join_pairs": self.pairs, "join_kept": self.kept}

    def result(self) -> dict[str, Any]:
        return {"pairs": self.pairs, "kept": self.kept}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {k: sum(r[k] for r in results) for k in ("pairs", "kept")}


def side_key_fields(args: dict[str, Any], src: str) -> list[str] | None:
    """A join's inputs are each grouped on their own key field."""
    if src == args.get("left"):
        return [args.get("left_key")]
    if src == args.get("right"):
        return [args.get("right_key")]
    return None


def _check_two(left: Any, right: Any) -> None:
    if left == right:
        raise ValueError("left and right must be two different nodes")


def _check_sides(args: dict[str, Any], inputs: dict[str, list[str]], what: tuple) -> None:
    """``left`` and ``right`` are the node's two inputs and produce the fields named."""
    for side in ("left", "right"):
        node = args.get(side)
        if node not in inputs:
            have = ", ".join(sorted(inputs)) or "none"
            raise ValueError(f"{side} '{node}' is not an input of this node (inputs: {have})")
        for w in what:
            field = args.get(f"{side}_{w}")
            if field not in inputs[node]:
                raise ValueError(
                    f"{side}_{w} '{field}' is not a field '{node}' produces "
                    f"(it produces: {', '.join(inputs[node]) or 'no fields'})"
                )
    if len(inputs) != 2:
        raise ValueError(f"a join takes exactly two inputs, not {len(inputs)}")
