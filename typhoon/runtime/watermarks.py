"""Event-time watermarks, in-band like checkpoint anchors (docs/windows.md).

A spout with ``watermark: {time_field: F, out_of_order_ms: N}`` in the topology
file gets watermarks from the framework: the largest ``F`` it emitted minus
``N`` (bounded out-of-orderness), or with ``{clock: processing}`` the source's
wall clock minus ``N``.  A watermark ``W`` says "no tuple with a time below
``W`` follows on this link".  It travels as a punctuation on the reserved stream
0 behind the data it covers, ``[["wm", W, idle, channel, channels]]``: on the
unicast path to every receiver (``channel`` 0) and, for a one-to-many stream on
a multicast transport, also on that stream's group path (``channel`` = stream):
a watermark must not overtake the data of the path it covers, and the two
paths are not ordered with each other.  The unicast copy says how many
channels a receiver gets from that sender; its watermark from the sender is
the minimum over them once every one has spoken.

A worker's watermark is the minimum over its live input links (a finished
link no longer counts, an *idle* one neither, until data comes from it again);
it only goes up.  When it advances, the operator's ``on_watermark(wm, emit)``
runs and the watermark is passed on behind what that emitted.  When every
input finished, the watermark is +inf (``INF``): every window closes.

An operator whose output is not its input's time (a spark node: Spark emits
later, by its own watermark) owns its output watermark: with an
``output_watermark()`` method, the framework passes on what that returns
after each pump (when it went up) instead of the input's; ``on_watermark``
still tells it the input's.

Pure parts (:class:`WatermarkSpec`, :class:`WatermarkGenerator`,
:class:`InputWatermarks`) are tested without a worker; :class:`WatermarkHandling`
is a mixin of :class:`typhoon.runtime.framework.Framework`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from typhoon.operators.windowing import is_time
from typhoon.runtime.transport import EOS_STREAM
from typhoon.topology.model import DEFAULT_STREAM
from typhoon.wire import decode_value

if TYPE_CHECKING:
    from typhoon.runtime.framework_parts import FrameworkParts

INF = math.inf
DEFAULT_INTERVAL_MS = 200.0  # a spout sends its watermark at most this often


@dataclass(frozen=True)
class WatermarkSpec:
    """A spout's ``watermark:`` mapping from the topology file."""

    time_field: str | None = None
    out_of_order_ms: float = 0.0
    clock: str = "event"  # event | processing
    idle_timeout_ms: float | None = None
    interval_ms: float = DEFAULT_INTERVAL_MS

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> WatermarkSpec | None:
        if not d:
            return None
        return cls(
            d.get("time_field"),
            float(d.get("out_of_order_ms", 0)),
            d.get("clock", "event"),
            None if d.get("idle_timeout_ms") is None else float(d["idle_timeout_ms"]),
            float(d.get("interval_ms", DEFAULT_INTERVAL_MS)),
        )


def watermark_payload(wm: int, idle: bool, channel: int, channels: int) -> bytes:
    data: bytes = msgpack.packb([["wm", wm, int(idle), channel, channels]], use_bin_type=True)
    return data


def parse_watermark(payload: bytes) -> tuple[int, bool, int, int] | None:
    """``(wm, idle, channel, channels)`` of a watermark punctuation, else None."""
    try:
        row = decode_value(payload)[0]
    except Exception:
        return None
    if (
        type(row) is list
        and len(row) == 5
        and row[0] == "wm"
        and all(type(v) is int for v in row[1:])
    ):
        return row[1], bool(row[2]), row[3], row[4]
    return None


class WatermarkGenerator:
    """A spout's watermark from what it emits (bounded out-of-orderness) or its clock.

    ``index`` is the time field's position in the spout's tuples.  A tuple whose
    time is not a number does not move the watermark; it is counted (``bad``).
    """

    def __init__(self, spec: WatermarkSpec, index: int | None) -> None:
        self.spec = spec
        self.index = index
        self.max_ts: float | None = None
        self.bad = 0

    def observe(self, values: list[Any]) -> None:
        i = self.index
        if i is None:
            return
        try:
            ts = values[i]
        except (IndexError, TypeError):
            self.bad += 1
            return
        if not is_time(ts):
            self.bad += 1
        elif self.max_ts is None or ts > self.max_ts:
            self.max_ts = ts

    def observe_rows(self, rows: list[list[Any]]) -> None:
        for values in rows:
            self.observe(values)

    def current(self, wall_ms: float) -> int | None:
        """The watermark now (an int: floored, so never ahead of the bound); None: no
        tuple yet."""
        if self.spec.clock == "processing":
            return math.floor(wall_ms - self.spec.out_of_order_ms)
        if self.max_ts is None:
            return None
        return math.floor(self.max_ts - self.spec.out_of_order_ms)


class InputWatermarks:
    """The watermark of each input link, and their minimum over the live ones."""

    def __init__(self) -> None:
        self.channels: dict[int, dict[int, int]] = {}  # sender -> channel -> watermark
        self.expected: dict[int, int] = {}  # sender -> channels it sends on (from channel 0)
        self.idle: set[int] = set()

    def update(self, src: int, wm: int, idle: bool, channel: int, channels: int) -> None:
        seen = self.channels.setdefault(src, {})
        if wm > seen.get(channel, -INF):
            seen[channel] = wm
        if channel == 0:
            self.expected[src] = max(1, channels)
            if idle:
                self.idle.add(src)
            else:
                self.idle.discard(src)

    def active(self, src: int) -> bool:
        """Data came from ``src``: it is no longer idle.  True if it was."""
        if src in self.idle:
            self.idle.discard(src)
            return True
        return False

    def of(self, src: int) -> int | None:
        """The sender's watermark: the minimum of its channels, once all of them spoke."""
        seen = self.channels.get(src)
        need = self.expected.get(src)
        if not seen or need is None or len(seen) < need:
            return None
        return min(seen.values())

    def combined(self, live: set[int]) -> tuple[int | None, bool]:
        """``(minimum over the live links that are not idle, every live link idle)``.

        None while one of them has not sent a watermark yet (it holds everything back)."""
        busy = [s for s in live if s not in self.idle]
        if not busy:
            return None, bool(live)
        low: int | None = None
        for s in busy:
            w = self.of(s)
            if w is None:
                return None, False
            if low is None or w < low:
                low = w
        return low, False


if TYPE_CHECKING:
    _Host = FrameworkParts
else:
    _Host = object  # at run time Framework is the host: nothing to inherit


class WatermarkHandling(_Host):
    """Watermarks of one worker: generated (spouts), combined (bolts), passed on."""

    def _init_watermarks(self) -> None:
        spec = WatermarkSpec.from_dict(self.node.watermark) if self.is_spout else None
        self.wm_gen: WatermarkGenerator | None = None
        if spec is not None:
            fields = list(self.node.output_fields)
            index = fields.index(spec.time_field) if spec.time_field in fields else None
            self.wm_gen = WatermarkGenerator(spec, index)
        self.wm_in = InputWatermarks()
        self.watermark: float | None = None  # this worker's, only goes up
        self.wm_idle = False  # we told our receivers we are idle
        self.wm_sent = 0  # watermark punctuations sent (per receiver and channel)
        self.wm_next_at = self.now
        self.wm_last_emit = self.now
        self._on_watermark = getattr(self.op, "on_watermark", None)
        self._on_timer = getattr(self.op, "on_timer", None)
        self._wm_owner = getattr(self.op, "output_watermark", None)
        self.wm_out: int | None = None  # what an owning operator's output carries

    def wm_emitters(self) -> tuple[Callable[..., None], Callable[..., None]]:
        """``emit`` and ``emit_rows`` of a spout that watch the time field."""
        gen = self.wm_gen
        assert gen is not None
        emit, emit_rows = self.emit, self.emit_rows

        def emit_watched(values: list[Any], stream: str = DEFAULT_STREAM) -> None:
            gen.observe(values)
            emit(values, stream)

        def emit_rows_watched(rows: list[list[Any]], stream: str = DEFAULT_STREAM) -> None:
            gen.observe_rows(rows)
            emit_rows(rows, stream)

        return emit_watched, emit_rows_watched

    def spout_watermark(self, emitted: bool) -> None:
        """After a spout's turn: send its watermark when due, or say it is idle."""
        gen = self.wm_gen
        if gen is None or self.done or not self.active:
            return
        if emitted:
            self.wm_last_emit = self.now
        if self.now < self.wm_next_at:
            return
        self.wm_next_at = self.now + gen.spec.interval_ms / 1000.0
        wm = gen.current(time.time() * 1000.0)
        timeout = gen.spec.idle_timeout_ms
        if wm is not None and (self.watermark is None or wm > self.watermark):
            self.watermark = wm
            self.wm_idle = False
            self._send_watermark(wm, False)
        elif (
            timeout is not None
            and not self.wm_idle
            and self.now - self.wm_last_emit >= timeout / 1000.0
        ):
            self.wm_idle = True
            self._send_watermark(self._wire_wm(), True)
        elif self.wm_idle and emitted:
            self.wm_idle = False
            self._send_watermark(self._wire_wm(), False)

    def _wire_wm(self) -> int:
        w = self.watermark if self._wm_owner is None else self.wm_out
        return -(2**62) if w is None else int(w)

    def _watermark_from(self, src: int, payload: bytes) -> None:
        parsed = parse_watermark(payload)
        if parsed is None:
            self.io.stats.drop("malformed_punctuation")
            return
        self.wm_in.update(src, *parsed)
        self._recompute_watermark()

    def _wm_data_from(self, src: int) -> None:
        """Data arrived from ``src`` (only called while some input is idle)."""
        if self.wm_in.active(src):
            self._recompute_watermark()

    def _holding(self) -> bool:
        """A rescale moves keys: the watermark waits while tuples here wait for their keys'
        state (it would overtake tuples sent before it), and while keys leaving here have
        not left (their tuples after the handoff go to the new owner: a watermark that
        came here after it does not cover them).  docs/windows.md."""
        m = self.migration
        return bool(
            self.holding
            or self.holding_keys
            or self.hold_from
            or (m is not None and m.leaving and not m.shipped)
        )

    def _recompute_watermark(self) -> None:
        if self._holding():
            return  # the migration's end recomputes it
        live = self.pending_upstream & self.upstream
        if not live:
            return  # every input finished: end_of_input advances to +inf
        wm, all_idle = self.wm_in.combined(live)
        if wm is not None and (self.watermark is None or wm > self.watermark):
            self.wm_idle = False
            self._advance_watermark(wm)
        elif all_idle != self.wm_idle:
            self.wm_idle = all_idle
            if self.watermark is not None or all_idle:
                self._send_watermark(self._wire_wm(), all_idle)

    def _advance_watermark(self, wm: float) -> None:
        """The worker's watermark went up: the operator fires, then it is passed on."""
        self.watermark = wm
        if self._on_timer is not None:
            for ts, key in self.context.timers.due(wm):
                self._on_timer(ts, key, self.emit)
        if self._on_watermark is not None:
            self._on_watermark(wm, self.emit)
        if wm != INF and self._wm_owner is None:  # +inf travels as end of stream
            self._send_watermark(int(wm), False)

    def owned_watermark(self) -> None:
        """After an owning operator's pump: pass its output watermark on when it went up."""
        owner = self._wm_owner
        if owner is None or self.done:
            return
        wm = owner()
        if wm is None or wm == INF or (self.wm_out is not None and wm <= self.wm_out):
            return  # +inf travels as end of stream
        self.wm_out = int(wm)
        self.wm_idle = False
        self._send_watermark(self.wm_out, False)

    def watermark_input_done(self) -> None:
        """Every input finished (not a drain): every window closes."""
        if self._holding():
            return  # once the held tuples ran (migration_tick)
        if self.watermark != INF and (
            self._on_watermark is not None or self._on_timer is not None or self.wm_in.channels
        ):
            self._advance_watermark(INF)

    def _send_watermark(self, wm: int, idle: bool) -> None:
        """One watermark punctuation on every path to every receiver, behind our data."""
        self.flush(force=True)
        unicast: dict[int, int] = {}  # receiver -> channels it gets from us
        groups: list[tuple[int, list[int]]] = []
        balanced = False
        for sid, r in self.routers.items():
            for h in r.hops:
                unicast[h] = unicast.get(h, 1)
            if r.broadcast and self.io.multicast and r.hops:
                groups.append((sid, list(r.hops)))
                for h in r.hops:
                    unicast[h] += 1
            balanced = balanced or r.switched
        if balanced:  # balanced frames take the switch's path: they go first
            self.io.drain_balanced()
        io = self.io
        for dst, n in unicast.items():
            io.send(dst, EOS_STREAM, [watermark_payload(wm, idle, 0, n)])
        for sid, hops in groups:
            io.send_group(sid, hops, [watermark_payload(wm, idle, sid, 0)], stream=EOS_STREAM)
        self.wm_sent += len(unicast) + sum(len(h) for _, h in groups)

    def watermark_released(self) -> None:
        """The held tuples ran: the watermark catches up with what arrived meanwhile."""
        if self.input_done and not self.draining:
            self.watermark_input_done()
        elif self.wm_in.channels:
            self._recompute_watermark()

    def _reset_watermarks(self) -> None:
        """After a rollback: links start over; what was emitted before is redone."""
        self.wm_in = InputWatermarks()
        self.watermark = None
        self.wm_out = None
        self.wm_idle = False
        if self.wm_gen is not None:
            self.wm_gen = WatermarkGenerator(self.wm_gen.spec, self.wm_gen.index)
        self._on_watermark = getattr(self.op, "on_watermark", None)
        self._on_timer = getattr(self.op, "on_timer", None)
        self._wm_owner = getattr(self.op, "output_watermark", None)

    def _event_time(self) -> bool:
        """Does this worker take part in event time (metrics are reported)?"""
        return bool(
            self.wm_gen
            or self.wm_in.channels
            or self._on_timer is not None
            or self._wm_owner is not None
        )

    def _watermark_metrics(self) -> dict[str, Any]:
        w = self.watermark
        out: dict[str, Any] = {
            "watermark_closed": int(w == INF),  # +inf: every input finished
            "watermark_idle": int(self.wm_idle),
            "watermarks_sent": self.wm_sent,
        }
        if w is not None and w != INF:  # METRIC_RESP carries numbers, not None
            out["watermark"] = int(w)
        if self.wm_out is not None:
            out["watermark_out"] = self.wm_out
        if self.wm_gen is not None:
            out["watermark_bad_time"] = self.wm_gen.bad
        if self._on_timer is not None:
            out["timers_pending"] = self.context.timers.pending()
            out["timers_fired"] = self.context.timers.fired
        return out
