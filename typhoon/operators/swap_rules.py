"""Which operators a worker can replace in place (``typhoon swap`` of a chained node).

A swap in place ends the old instance inside its worker as its end of input would
(``on_signal``, ``result()``, ``close()``) and opens the new one on the same
framework: routes, links, counters and the chain's function calls stay.  That is
only right when the framework holds nothing for the operator that the new one
would inherit or lose: an engine's output still in flight (``pump``,
``anchor_ready``) or event-time callbacks and their timers (``on_watermark``,
``on_timer``, ``output_watermark``).  Keyed state and checkpoints are the plan's
and the worker's own checks (``typhoon.reconfig.swap_in_place``,
``typhoon.runtime.operator_swap``).
"""

from __future__ import annotations

from typing import Any

IN_PLACE_BLOCKERS = ("pump", "anchor_ready", "on_watermark", "on_timer", "output_watermark")


def in_place_blockers(operator: Any) -> list[str]:
    """The hooks of ``operator`` (a class or an instance) that keep it from a swap in place."""
    return [h for h in IN_PLACE_BLOCKERS if getattr(operator, h, None) is not None]
