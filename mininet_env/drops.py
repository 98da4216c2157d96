"""Frames the switches dropped during a run: the counters of every drop rule.

The compiled rules send every frame a worker, the controller or a fabric link
legitimately produces somewhere; the drop rules (a worker port's anti-spoofing
rule, a bridge's priority-0 default) only ever count mistakes or attacks.  A run
therefore snapshots their counters before it starts and after its workers
finished, and any increase is reported as a problem naming the bridge and rule,
so that a frame lost to a missing rule cannot hide behind an ``ok``.
"""

from __future__ import annotations

import re
import subprocess

_FLOW = re.compile(r"n_packets=(\d+), n_bytes=(\d+), (\S+) actions=drop\s*$")
# the fault detector's rule for a dead worker's address (controller/rules/dead_addresses.py)
_DEAD = re.compile(r"^priority=20,dl_dst=([0-9a-f:]{17})$")


def drop_counters(bridges: list[str]) -> dict[tuple[str, str], tuple[int, int]]:
    """(bridge, rule match) -> (packets, bytes) of every rule whose action is drop."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for br in bridges:
        text = subprocess.run(
            ["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", br],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        out.update(parse_drop_rules(br, text))
    return out


def parse_drop_rules(bridge: str, dump: str) -> dict[tuple[str, str], tuple[int, int]]:
    """The drop rules in one ``ovs-ofctl dump-flows`` output."""
    out = {}
    for line in dump.splitlines():
        m = _FLOW.search(line)
        if m:
            out[(bridge, m.group(3))] = (int(m.group(1)), int(m.group(2)))
    return out


def drops_between(
    before: dict[tuple[str, str], tuple[int, int]],
    after: dict[tuple[str, str], tuple[int, int]],
) -> list[tuple[str, str, str]]:
    """(bridge, rule match, one line) per drop rule that counted frames between the two
    snapshots."""
    out = []
    for (br, match), (packets, nbytes) in sorted(after.items()):
        p0, b0 = before.get((br, match), (0, 0))
        if packets < p0:  # the rule was replaced meanwhile: its counter started over
            p0, b0 = 0, 0
        if packets > p0:
            line = f"switch {br}: {packets - p0} frames ({nbytes - b0} bytes) met drop rule {match}"
            out.append((br, match, line))
    return out


def drop_problems(
    before: dict[tuple[str, str], tuple[int, int]],
    after: dict[tuple[str, str], tuple[int, int]],
) -> list[str]:
    """One line per drop rule that counted frames between the two snapshots."""
    return [line for _, _, line in drops_between(before, after)]


def split_dead_address_drops(
    drops: list[tuple[str, str, str]], dead: dict[str, int]
) -> tuple[dict[int, list[str]], list[str]]:
    """The drops of a dead worker's address rule, by worker (``dead``: MAC -> worker ID,
    the incidents of the run), and every other drop line (a problem)."""
    by_worker: dict[int, list[str]] = {}
    rest = []
    for _, match, line in drops:
        m = _DEAD.match(match)
        wid = dead.get(m.group(1)) if m else None
        if wid is None:
            rest.append(line)
        else:
            by_worker.setdefault(wid, []).append(line)
    return by_worker, rest
