"""Control tuples that must be confirmed: send each with a fresh version, then
wait (``controller/waits.py``) until every worker acked it or exited."""

from __future__ import annotations

from typing import Any, Protocol

from controller.waits import WAIT, Check
from typhoon.topology.routing import Route
from typhoon.wire import Control, ControlTuple

# (worker, version) -> worker: what to await
Sent = dict[tuple[int, int], int]


class Core(Protocol):
    view: Any

    def send_control(self, app: str, worker_ids: Any, ct: ControlTuple) -> int: ...
    def next_control_version(self) -> int: ...
    def acked(self, app: str, what: str, version: int) -> set[int]: ...


def send_each(core: Core, app: str, ctype: str, bodies: Any) -> Sent:
    """One control tuple per (worker, body) (a dict or pairs), each with a fresh version."""
    items = bodies.items() if isinstance(bodies, dict) else bodies
    sent = {}
    for w, body in items:
        v = core.next_control_version()
        core.send_control(app, [w], ControlTuple(Control[ctype], {**body, "version": v}))
        sent[(w, v)] = w
    return sent


def send_routes(core: Core, app: str, routes: dict[int, list[Route]]) -> Sent:
    """ROUTING: every route of every worker in ``routes``."""
    return send_each(
        core, app, "ROUTING", [(s, r.to_body()) for s, rs in routes.items() for r in rs]
    )


def all_acked(core: Core, app: str, ctype: str, sent: Sent, deadline: float) -> Check:
    """A check: '' once every sent tuple is acked; what is missing after ``deadline``.

    A worker that exited meanwhile counts as done: it reads nothing any more.
    """
    pending = dict(sent)

    def check(now: float) -> Any:
        view = core.view.apps.get(app)
        if view is None:
            return "the application is gone"
        for w, v in list(pending):
            s = view.statuses.get(w)
            if w in core.acked(app, ctype, v) or (s is not None and s.state == "exited"):
                del pending[(w, v)]
        if not pending:
            return ""
        if now > deadline:
            return f"workers {sorted(set(pending.values()))} did not confirm {ctype}"
        return WAIT

    return check
