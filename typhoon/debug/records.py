"""Mirrored frames -> tuple records: decode, filter, sample, count (the debug worker's logic).

Pure (no device, no network), so it is tested with frames built by
``typhoon.wire``.  The frames are copies the switch made of the observed
worker's traffic; they are decoded with the wire format (the one parser the
workers use too), and anything that is not a Typhoon data frame of the
application is summarised by the scapy layer instead of being hidden.

Each link's frame sequence numbers (+1 per frame, see ``typhoon.wire``) show
copies that never reached the debug worker: the switch drops mirror copies
rather than slow the observed worker down, and ``seq_gaps`` says how many.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from typhoon import wire
from typhoon.debug.filter import MatchAll
from typhoon.runtime.transport import EOS_STREAM
from typhoon.wire import AddrClass, Kind, WireError

MATCH_ALL = MatchAll()
_ANY_MTU = 1 << 20  # a mirror copy is as long as the original; never refuse it for size
_U32 = 0xFFFFFFFF


@dataclass
class DecoderStats:
    """What the debug worker saw; sent to the controller with every batch of records."""

    frames: int = 0  # frames read off the debug port
    data_frames: int = 0
    tuples: int = 0  # data tuples seen (decoded, except those sampling left out unfiltered)
    matched: int = 0  # tuples that passed the filter
    sampled_out: int = 0  # matched, but left out by sampling
    eos: int = 0  # end-of-stream punctuations
    other: int = 0  # credit or control frames (a mirror of data rules carries none)
    undecodable: int = 0  # not a Typhoon frame of this application, or malformed
    seq_gaps: int = 0  # copies lost between the switch and the debug worker
    links: dict[str, int] = field(default_factory=dict)  # "src->dst" -> data frames

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def json_safe(value: Any) -> Any:
    """Tuple values as JSON: bytes become text, map keys strings, tuples lists."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    return value


def scapy_summary(frame: bytes) -> str:
    """One line about a frame the wire format refuses (scapy is imported only when needed)."""
    from scapy.layers.l2 import Ether

    import typhoon.dissect  # noqa: F401  (binds the Typhoon layer to its EtherType)

    try:
        return Ether(frame).summary()
    except Exception as e:  # scapy may raise anything on garbage; the record says so
        return f"undissectable frame ({type(e).__name__})"


class MirrorDecoder:
    """Turns mirror copies into records; keeps :class:`DecoderStats`."""

    def __init__(
        self,
        app_id: int,
        workers: Mapping[int, tuple[str, int]],
        fields: Mapping[str, list[str]],
        accept: Callable[[Mapping[str, Any]], bool] = MATCH_ALL,
        sample: float = 100.0,
        rng: random.Random | None = None,
        ethertype: int = wire.ETHERTYPE,
    ) -> None:
        self.app_id = app_id
        self.workers = dict(workers)
        self.fields = {n: list(f) for n, f in fields.items()}
        self.accept = accept
        self.show_raw = isinstance(accept, MatchAll)  # a field filter never matches raw frames
        self.sample = float(sample)
        self.rng = rng or random.Random()
        self.ethertype = ethertype
        self.stats = DecoderStats()
        self.reassembler = wire.Reassembler()
        self.next_seq: dict[tuple[bytes, bytes, int], int] = {}

    def feed(self, data: bytes, now: float) -> list[dict[str, Any]]:
        """Records for one mirrored frame (usually one per tuple that passed)."""
        st = self.stats
        st.frames += 1
        try:
            frame = wire.decode_frame(data, self.ethertype, mtu=_ANY_MTU)
            src = wire.parse_mac(frame.src)
            dst = wire.parse_mac(frame.dst)
            if src.app_id != self.app_id or src.cls != AddrClass.WORKER:
                raise WireError(f"frame from another sender ({wire.mac_str(frame.src)})")
        except WireError:
            st.undecodable += 1
            return [self._raw(data, now)] if self.show_raw else []
        if frame.kind != Kind.DATA:
            st.other += 1
            return []
        st.data_frames += 1
        self._check_seq(frame)
        link = f"{src.value}->{dst.value if dst.cls == AddrClass.WORKER else dst.cls.name.lower()}"
        st.links[link] = st.links.get(link, 0) + 1
        payloads = frame.payloads
        if frame.flags & wire.SEG:
            try:
                payloads = self.reassembler.feed(frame)
            except WireError:
                st.undecodable += 1
                return []
        if frame.stream == EOS_STREAM:
            st.eos += len(payloads)
            return []
        rows: list[list] = []
        for p in payloads:  # each entry a row batch or a column block: one decoding each
            try:
                rows.extend(_entry_rows(p))
            except WireError:
                st.undecodable += 1
        if self.show_raw and self.sample < 100.0:  # no filter: sample before building records
            keep = self.sample / 100.0
            rnd = self.rng.random
            chosen = [v for v in rows if rnd() < keep]
            skipped = len(rows) - len(chosen)
            st.tuples += skipped
            st.matched += skipped
            st.sampled_out += skipped
            rows = chosen
            sampled = True
        else:
            sampled = self.sample >= 100.0
        return [r for v in rows if (r := self._tuple(v, frame, src, dst, now, sampled)) is not None]

    def _check_seq(self, frame: wire.Frame) -> None:
        key = (frame.src, frame.dst, frame.stream)
        expect = self.next_seq.get(key)
        if expect is not None and frame.seq != expect:
            gap = (frame.seq - expect) & _U32
            if gap < 1 << 31:  # an older frame is a reordering, not a loss
                self.stats.seq_gaps += gap
        self.next_seq[key] = (frame.seq + 1) & _U32

    def _tuple(
        self,
        values: list,
        frame: wire.Frame,
        src: wire.Address,
        dst: wire.Address,
        now: float,
        sampled: bool,
    ) -> dict[str, Any] | None:
        """One tuple's record, or None.  Filter, then sample (unless ``sampled``
        already), then build the record: a tuple left out costs its share of the decoding and
        little else (the debug worker shares the machine with what it watches)."""
        st = self.stats
        st.tuples += 1
        src_node, src_index = self.workers.get(src.value, ("?", 0))
        named: dict[str, Any] | None = None
        if not self.show_raw:  # a field filter: it sees the named fields and the metadata
            named = dict(zip(self.fields.get(src_node, []), values, strict=False))
            meta: dict[str, Any] = {"_src": src.value, "_src_node": src_node,
                                    "_stream": frame.stream}  # fmt: skip
            if dst.cls == AddrClass.WORKER:
                meta.update(_dst=dst.value, _dst_node=self.workers.get(dst.value, ("?", 0))[0])
            if not self.accept({**named, **meta}):
                return None
        st.matched += 1
        if not sampled and self.rng.random() * 100.0 >= self.sample:
            st.sampled_out += 1
            return None
        if named is None:
            named = dict(zip(self.fields.get(src_node, []), values, strict=False))
        record: dict[str, Any] = {
            "time": now,
            "src": src.value,
            "src_label": f"{src_node}[{src_index}]",
            "stream": frame.stream,
            "seq": frame.seq,
        }
        if dst.cls == AddrClass.WORKER:
            dst_node, dst_index = self.workers.get(dst.value, ("?", 0))
            record.update(dst=dst.value, dst_label=f"{dst_node}[{dst_index}]")
        elif dst.cls == AddrClass.LOAD_BALANCER:  # copied before the switch picks a receiver
            record.update(dst=None, dst_label=f"lb:{dst.value >> 8}/{dst.value & 0xFF}")
        else:
            record.update(dst=None, dst_label=f"group:{dst.value}")
        record["fields"] = json_safe(named)
        record["values"] = json_safe(values)
        return record

    def _raw(self, data: bytes, now: float) -> dict[str, Any]:
        return {"time": now, "raw": scapy_summary(data), "len": len(data)}


def _entry_rows(entry: bytes) -> list[list[Any]]:
    """The rows of a data entry: a row batch, or a column block (numpy is imported only
    when one is seen: the mirror runs in the controller)."""
    if wire.is_block(entry):
        from typhoon.wire.columns import entry_rows

        return entry_rows(entry)
    return wire.decode_rows(entry)
