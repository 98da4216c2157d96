"""Which workers must be told a new flow-control budget (FLOW_CONTROL), free of Ryu.

Agents start workers with their share of the switch's socket buffers
(``typhoon/port_budgets.py``) as the physical topology they launch them
from says; workers added or moved later change the shares of the others, so
the core (``controller/core.py``) tells every attached worker whose share
differs from what it was last told.  Applications that set
``sdn.port_budget`` (or turn flow control off) keep theirs.
"""

from __future__ import annotations

import logging

from controller.rules.view import ClusterView
from typhoon.port_budgets import plan_budgets


def budget_updates(
    view: ClusterView, told: dict[tuple[str, int], int], logger: logging.Logger
) -> list[tuple[str, int, int]]:
    """(app, worker, budget) to send; ``told`` forgets applications that are gone."""
    for key in [k for k in told if k[0] not in view.apps]:
        del told[key]
    updates = []
    for name, app in view.apps.items():
        config = app.topology.config
        if "port_budget" in (config.get("sdn") or {}) or config.get("flow_control") is False:
            continue
        try:
            budgets = plan_budgets(app.topology, app.physical, view.cluster).budgets
        except (ValueError, KeyError) as e:
            logger.error("app %s: no budgets: %s", name, e)
            continue
        for wid, budget in budgets.items():
            status = app.statuses.get(wid)
            if status is None or status.state not in ("attached", "running"):
                continue
            if told.get((name, wid)) != budget:
                updates.append((name, wid, budget))
    return updates
