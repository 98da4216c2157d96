"""Ad analytics, the shape of the Yahoo streaming benchmark (paper Fig. 13).

Events are generated deterministically (like the benchmark's generator, but
from a seed), so the expected per-campaign, per-window counts come from
:func:`reference_window_counts` without running anything.  The pipeline is
source -> ``parse_json`` -> ``filter`` (views) -> ``project`` -> join with the
campaign table -> 10-second event-time window count per campaign; the last
two steps run on Spark (``pyspark_bridge.examples``, topologies/ad_analytics.yaml)
or on the python engine as the built-ins ``lookup`` and ``window_aggregate``
(topologies/ad_analytics_native.yaml).
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Iterator
from operator import itemgetter
from pathlib import Path
from typing import Any, ClassVar

from typhoon.operators.base import Bolt, Context, Emit
from typhoon.operators.sinks import Collect
from typhoon.operators.sources import CountingSpout, _mix, _offset_int

AD_TYPES = ("banner", "modal", "sponsored-search", "mail", "mobile")
EVENT_TYPES = ("view", "click", "purchase")
START_MS = 1_700_000_000_000  # event time of event 0 (ms since the epoch)
EVENT_KEYS = ("user_id", "page_id", "ad_id", "ad_type", "event_type", "event_time")


def _uuid(namespace: int, k: int) -> str:
    """A stable UUID-shaped id (the benchmark uses UUIDs for users, pages, ads, campaigns)."""
    h = f"{_mix(namespace * 0x1000193 + k):016x}{_mix(namespace + k * 0x9E3779B9):016x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def ad_id(k: int) -> str:
    return _uuid(0xAD, k)


def campaign_id(c: int) -> str:
    return _uuid(0xCA, c)


def campaign_table(campaigns: int = 100, ads: int = 10) -> list[tuple[str, str]]:
    """``(ad_id, campaign_id)`` rows: ``ads`` ads per campaign, as in the benchmark."""
    return [(ad_id(k), campaign_id(k // ads)) for k in range(campaigns * ads)]


def write_campaign_table(path: str | Path, campaigns: int = 100, ads: int = 10) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["ad_id", "campaign_id"])
        w.writerows(campaign_table(campaigns, ads))


def read_campaign_table(path: str | Path) -> dict[str, str]:
    with open(path, newline="", encoding="utf-8") as f:
        return {row["ad_id"]: row["campaign_id"] for row in csv.DictReader(f)}


def ad_event(
    i: int, seed: int, campaigns: int, ads: int, start_ms: int, per_second: int
) -> dict[str, Any]:
    """Event number ``i``; event time advances ``per_second`` events per second."""
    r = _mix((seed * 0x100000001B3 + i) & 0xFFFFFFFFFFFFFFFF)
    return {
        "user_id": _uuid(0x05E4, r & 0xFFFF),
        "page_id": _uuid(0x9A6E, (r >> 16) & 0xFFFF),
        "ad_id": ad_id((r >> 32) % (campaigns * ads)),
        "ad_type": AD_TYPES[(r >> 48) % len(AD_TYPES)],
        "event_type": EVENT_TYPES[(r >> 56) % len(EVENT_TYPES)],
        "event_time": start_ms + i * 1000 // per_second,
        "ip_address": "1.2.3.4",
    }


def generate_ad_events(
    count: int,
    seed: int = 1,
    campaigns: int = 100,
    ads: int = 10,
    start_ms: int = START_MS,
    per_second: int = 1000,
) -> Iterator[dict[str, Any]]:
    """Every event ``ad_event_source`` with these arguments emits, over all its workers."""
    for i in range(count):
        yield ad_event(i, seed, campaigns, ads, start_ms, per_second)


def reference_window_counts(
    count: int,
    seed: int = 1,
    campaigns: int = 100,
    ads: int = 10,
    start_ms: int = START_MS,
    per_second: int = 1000,
    window_ms: int = 10_000,
    event_type: str = "view",
) -> dict[tuple[str, int], int]:
    """``(campaign_id, window_start_ms) -> count`` of ``event_type`` events: the expected result."""
    return reference_swap_counts(
        count, count, (event_type,), (), seed, campaigns, ads, start_ms, per_second, window_ms
    )


def reference_swap_counts(
    count: int,
    swap_at: int,
    before: tuple[str, ...] = ("view",),
    after: tuple[str, ...] = ("view", "click"),
    seed: int = 1,
    campaigns: int = 100,
    ads: int = 10,
    start_ms: int = START_MS,
    per_second: int = 1000,
    window_ms: int = 10_000,
) -> dict[tuple[str, int], int]:
    """Expected counts when the filter passed ``before`` types for events ``[0, swap_at)`` and
    ``after`` types from event ``swap_at`` on (the filter swap of paper Fig. 14)."""
    table = dict(campaign_table(campaigns, ads))
    counts: dict[tuple[str, int], int] = {}
    for i, e in enumerate(generate_ad_events(count, seed, campaigns, ads, start_ms, per_second)):
        if e["event_type"] not in (before if i < swap_at else after):
            continue
        key = (table[e["ad_id"]], e["event_time"] - e["event_time"] % window_ms)
        counts[key] = counts.get(key, 0) + 1
    return counts


def per_window(counts: dict[tuple[str, int], int]) -> dict[int, int]:
    """``window_start_ms -> count`` summed over campaigns."""
    total: dict[int, int] = {}
    for (_campaign, start), n in counts.items():
        total[start] = total.get(start, 0) + n
    return dict(sorted(total.items()))


class AdEventSource(CountingSpout):
    """Ad events ``[event, ts]``: ``event`` is the JSON text, ``ts`` the wall-clock emit time.

    Args: ``count`` events over all workers (worker i takes events i, i+P, ...),
    ``seed``, ``rate`` tuples/s per worker (0 = unlimited), ``campaigns`` and
    ``ads`` per campaign (the campaign table must match), ``start_ms`` and
    ``per_second`` for the event-time clock.  ``time_field`` (optional) appends
    the event time as a field of that name, so the spout's ``watermark:`` can
    be taken from it (``topologies/ad_analytics_native.yaml``).
    """

    fields: ClassVar[tuple[str, ...]] = ("event", "ts")

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        extra = args.get("time_field")
        return [*cls.fields, extra] if extra else list(cls.fields)

    def __init__(
        self,
        count: int = 10_000,
        seed: int = 1,
        rate: float = 0.0,
        campaigns: int = 100,
        ads: int = 10,
        start_ms: int = START_MS,
        per_second: int = 1000,
        time_field: str | None = None,
    ) -> None:
        if time_field is not None and (
            not isinstance(time_field, str) or not time_field or time_field in self.fields
        ):
            raise ValueError(f"time_field must be a new field name, not {time_field!r}")
        for name, val, low in (
            ("count", count, 0),
            ("campaigns", campaigns, 1),
            ("ads", ads, 1),
            ("per_second", per_second, 1),
        ):
            if not isinstance(val, int) or val < low:
                raise ValueError(f"{name} must be an integer >= {low}")
        if not isinstance(rate, (int, float)) or rate < 0:
            raise ValueError("rate must be a non-negative number")
        super().__init__(
            count=count,
            seed=seed,
            rate=rate,
            campaigns=campaigns,
            ads=ads,
            start_ms=start_ms,
            per_second=per_second,
            time_field=time_field,
        )
        self.with_time = time_field is not None
        self.count, self.seed, self.rate = count, seed, float(rate)
        self.campaigns, self.ads, self.start_ms, self.per_second = (
            campaigns,
            ads,
            start_ms,
            per_second,
        )
        self.next_i = 0
        self.step = 1
        self.emitted = 0

    def open(self, context: Context) -> None:
        super().open(context)
        self.next_i, self.step = context.index, context.parallelism

    def next_batch(self, emit: Emit, max_count: int) -> bool:
        dumps, now = json.dumps, time.time()
        for _ in range(max_count):
            if self.next_i >= self.count:
                return False
            e = ad_event(
                self.next_i, self.seed, self.campaigns, self.ads, self.start_ms, self.per_second
            )
            text = dumps(e, separators=(",", ":"))
            emit([text, now, e["event_time"]] if self.with_time else [text, now])
            self.next_i += self.step
            self.emitted += 1
        return self.next_i < self.count

    def offset(self) -> dict[str, int]:
        return {"next": self.next_i, "emitted": self.emitted}

    def seek(self, offset: Any) -> None:
        self.next_i = _offset_int(offset, "next", self)
        self.emitted = _offset_int(offset, "emitted", self)


class ParseJson(Bolt):
    """Parses the JSON object in ``field`` into the fields ``keys``; other fields follow it.

    A tuple whose text is not a JSON object is dropped (counted in the result).
    """

    def __init__(self, keys: list[str], field: str | None = None) -> None:
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
            raise ValueError("keys must be a non-empty list of field names")
        super().__init__(keys=keys, field=field)
        self.keys, self.field = keys, field
        self.index = 0
        self.rest: list[int] = []
        self.malformed = 0

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        field = args.get("field") or (input_fields[0] if input_fields else None)
        if field not in input_fields:
            raise ValueError(f"field '{field}' is not one of the input fields {input_fields}")
        return list(args["keys"]) + [f for f in input_fields if f != field]

    def open(self, context: Context) -> None:
        super().open(context)
        fields = context.input_fields
        self.index = fields.index(self.field) if self.field else 0
        self.rest = [i for i in range(len(fields)) if i != self.index]

    def process(self, values: list, emit: Emit) -> None:
        try:
            obj = json.loads(values[self.index])
        except (TypeError, ValueError):
            obj = None
        if not isinstance(obj, dict):
            self.malformed += 1
            return
        emit([obj.get(k) for k in self.keys] + [values[i] for i in self.rest])

    def snapshot(self) -> dict[str, int]:
        return {"malformed": self.malformed}

    def restore(self, state: Any) -> None:
        self.malformed = int(state["malformed"])

    def result(self) -> dict[str, Any]:
        return {"malformed": self.malformed}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        return {"malformed": sum(r["malformed"] for r in results)}


class Project(Bolt):
    """Keeps the named ``fields``, in that order."""

    def __init__(self, fields: list[str]) -> None:
        if not isinstance(fields, list) or not fields:
            raise ValueError("fields must be a non-empty list of field names")
        super().__init__(fields=fields)
        self.keep = fields
        self.indexes: list[int] = []

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        missing = [f for f in args["fields"] if f not in input_fields]
        if missing:
            raise ValueError(f"fields {missing} are not among the input fields {input_fields}")
        return list(args["fields"])

    def open(self, context: Context) -> None:
        super().open(context)
        self.indexes = [context.input_fields.index(f) for f in self.keep]

    def process(self, values: list, emit: Emit) -> None:
        emit([values[i] for i in self.indexes])

    def process_batch(self, rows: list[list], emit: Emit) -> None:
        """:meth:`process` on a row batch: the fields picked in C (``itemgetter``)."""
        if len(self.indexes) == 1:
            for v in map(itemgetter(self.indexes[0]), rows):
                emit([v])
            return
        for picked in map(itemgetter(*self.indexes), rows):
            emit(list(picked))

    def process_columns(self, cols: Any, emit: Emit) -> None:
        """:meth:`process` on the columns of column blocks (``typhoon.wire.columns``): only
        the kept columns become Python values; the others are never read."""
        picked = [cols.column(i) for i in self.indexes]
        for values in zip(*picked, strict=True):
            emit(list(values))


class LatencyCollect(Collect):
    """``collect`` that also samples latency: arrival time minus the tuple's ``ts`` field.

    The result keeps ``[ts, latency]`` samples so a benchmark can drop a warm-up period.
    """

    MAX_SAMPLES: ClassVar[int] = 200_000

    def __init__(self, limit: int = 100_000, ts: str = "ts") -> None:
        super().__init__(limit=limit)
        self.args["ts"] = ts
        self.ts_field = ts
        self.ts_index = -1
        self.samples: list[list[float]] = []

    def open(self, context: Context) -> None:
        super().open(context)
        self.ts_index = context.input_fields.index(self.ts_field)

    def process(self, values: list, emit: Emit) -> None:
        super().process(values, emit)
        if len(self.samples) < self.MAX_SAMPLES:
            ts = values[self.ts_index]
            self.samples.append([ts, time.time() - ts])

    def snapshot(self) -> dict[str, Any]:
        return {**super().snapshot(), "samples": list(self.samples)}

    def restore(self, state: Any) -> None:
        super().restore(state)
        self.samples = [list(x) for x in state["samples"]]

    def result(self) -> dict[str, Any]:
        return {**super().result(), "samples": self.samples}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, Any]:
        merged = Collect.merge_results(results)
        merged["samples"] = [x for r in results for x in r["samples"]]
        merged["latency_s"] = percentiles([lat for _, lat in merged["samples"]])
        return merged


def percentiles(values: list[float]) -> dict[str, Any]:
    lat = sorted(values)

    def pct(p: float) -> float | None:
        return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None

    return {"p50": pct(0.5), "p99": pct(0.99), "max": lat[-1] if lat else None, "samples": len(lat)}
