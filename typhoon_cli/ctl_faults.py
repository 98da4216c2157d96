"""``typhoon faults`` as text: the fault detector's incidents, one block each
(``--json`` prints them as the controller sends them)."""

from __future__ import annotations

from typing import Any, TextIO


def print_faults(incidents: list[dict[str, Any]], out: TextIO) -> None:
    """One block per incident: what died, its replacement, its rollback, its sinks."""
    if not incidents:
        print("no incidents", file=out)
        return
    print("  app           worker  node        state      reason", file=out)
    for i in incidents:
        times = ", ".join(
            f"{label} {i[key]:.1f} ms"
            for key, label in (("reroute_ms", "rerouted"), ("rejoined_ms", "rejoined"))
            if i.get(key) is not None
        )
        lines = [
            f"{i['app'][:12]:<12}  {i['worker']:>6}  {i['node'][:10]:<10}  "
            f"{i['state']:<9}  {i['reason']}" + (f" ({times})" if times else "")
        ]
        if i.get("replacement") is not None:
            lines.append(f"{'':20}replaced by worker {i['replacement']}")
        if i.get("rollback"):
            epoch = i.get("restore_epoch")
            lines.append(
                f"{'':20}{i['rollback']} rollback of workers {i.get('rolled_back', [])} to "
                f"checkpoint {'the start' if epoch is None else epoch}, "
                f"{sum((i.get('replayed') or {}).values())} tuples replayed"
            )
        if i.get("sink_rate_before") is not None:  # typhoon/sink_rates.py
            back = i.get("back_at_80_ms")
            lines.append(
                f"{'':20}sinks {', '.join(i.get('sinks') or [])}: "
                + ("not back at 80% yet" if back is None else f"back at 80% after {back:.0f} ms")
                + f" ({i['sink_rate_before']:.0f}/s before, lowest {i['sink_rate_lowest']:.0f}/s)"
            )
        print("\n".join(f"  {line}" for line in lines), file=out)
