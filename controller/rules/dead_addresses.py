"""Drop rules for the addresses of dead workers, so that what still goes there is counted.

When a worker dies, its senders keep writing to its address until they hear of
the reroute, and a sender that held unconfirmed frames for it keeps probing it
(SYNC credit frames) until it gives up on it.  Once the physical topology no
longer has the worker, those frames match no forwarding rule and end on the
sender port's anti-spoofing rule or a bridge's default drop, where they look like
a mistake and fail the run (``mininet_env/drops.py``).  The fault detector adds
one rule per dead address on every bridge, below the forwarding rules and above
the anti-spoofing rule, so the switch counts them per dead worker and the run
report lists them with the incident that caused them (``typhoon/report.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.rules.cookies import RuleKind, make_cookie
from controller.rules.flows import PRIO_SPOOF_DROP, RuleSpec, match
from typhoon.wire import mac_str, worker_mac

# above SPOOF_DROP (10), below every forwarding rule (100): only frames no rule takes
PRIO_DEAD_ADDRESS = PRIO_SPOOF_DROP + 10


def dead_address_rules(
    app_id: int, workers: Iterable[int], hosts: Iterable[str]
) -> dict[str, frozenset[RuleSpec]]:
    """host -> one drop rule per dead worker's address (``eth_dst`` only)."""
    rules = frozenset(
        RuleSpec(
            PRIO_DEAD_ADDRESS,
            match(eth_dst=mac_str(worker_mac(app_id, wid))),
            (),
            make_cookie(app_id, RuleKind.DEAD_ADDRESS, wid),
        )
        for wid in workers
    )
    return {host: rules for host in hosts}
