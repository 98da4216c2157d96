"""What every wire field is checked against: the integer ranges and the one error.

A frame, address or control tuple that breaks them is a :class:`WireError` when
read, a ValueError when built (a caller's bug, not the network's).
"""

from __future__ import annotations

U16_MAX = 0xFFFF
U32_MAX = 0xFFFFFFFF
MAX_ID = 0xFFFE  # 0 and 0xFFFF are reserved for app ids and worker ids


class WireError(ValueError):
    """A frame, tuple or control tuple from the wire is malformed."""


def check_int(name: str, value: object, lo: int, hi: int) -> int:
    """Range-check an argument; bools are not ints here (True would be worker 1)."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")
    return value
