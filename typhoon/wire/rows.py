"""Tuples and row batches as msgpack: strict both ways, never pickle.

A data frame's entry is one row batch, encoded in one call, so a frame costs one
serialization, not one per tuple; a control tuple is one encoded ``[type, body]``.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack

from typhoon.wire.checks import WireError

# A Packer is ~3x faster than packb (no per-call setup) but not thread-safe.
_local = threading.local()
_unpackb = msgpack.unpackb


def _reject_ext(code: int, data: bytes) -> Any:
    raise WireError(f"msgpack extension type {code} is not allowed")


def _has_timestamp(value: Any) -> bool:
    if isinstance(value, msgpack.Timestamp):
        return True
    if isinstance(value, list):
        return any(_has_timestamp(v) for v in value)
    if isinstance(value, dict):
        return any(_has_timestamp(k) or _has_timestamp(v) for k, v in value.items())
    return False


def encode_tuple(values: list | tuple) -> bytes:
    """Serialize one tuple (a sequence of plain values) with msgpack; never pickle."""
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"a tuple must be a list or tuple, got {type(values).__name__}")
    try:
        pack = _local.pack
    except AttributeError:
        pack = _local.pack = msgpack.Packer(use_bin_type=True).pack
    return pack(values)  # the Packer resets its buffer if this raises


def decode_tuple(data: bytes) -> list:
    """Inverse of :func:`encode_tuple`; sequences come back as lists.

    Strict: plain msgpack types only (no extension types), and every failure is a
    WireError, whatever msgpack raised (ValueError, TypeError, StackError, ...).
    """
    if type(data) is not bytes:
        data = bytes(data)  # also makes the substring tests below meaningful
    try:
        value = _unpackb(data, raw=False, strict_map_key=False, ext_hook=_reject_ext)
    except WireError:
        raise
    except Exception as e:
        raise WireError(f"bad msgpack: {type(e).__name__}: {e}") from None
    if type(value) is not list:
        raise WireError(f"a tuple must be a msgpack array, got {type(value).__name__}")
    # msgpack turns ext type -1 into a Timestamp without asking ext_hook.  Only these
    # byte sequences can introduce one; the int test is a bare memchr (the cheapest
    # check CPython has) that spares most tuples the other three.
    if 0xFF in data and (b"\xd6\xff" in data or b"\xd7\xff" in data or b"\xc7\x0c\xff" in data):
        if _has_timestamp(value):
            raise WireError("msgpack timestamp extension is not allowed")
    return value


def encode_rows(rows: list) -> bytes:
    """Serialize a batch of tuples as one data entry (one msgpack array of arrays)."""
    try:
        pack = _local.pack
    except AttributeError:
        pack = _local.pack = msgpack.Packer(use_bin_type=True).pack
    return pack(rows)


def decode_rows(data: bytes) -> list[list]:
    """Inverse of :func:`encode_rows`, as strict as :func:`decode_tuple`.

    Every row must be a msgpack array; a batch with one bad row is rejected whole
    (it came from one sender's one serialization, so nothing in it is trusted).
    """
    value = decode_tuple(data)
    for row in value:
        if type(row) is not list:
            raise WireError(f"a row must be a msgpack array, got {type(row).__name__}")
    return value
