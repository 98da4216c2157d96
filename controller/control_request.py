"""What ``POST /typhoon/apps/NAME/control`` may send, and to which workers (paper Table 2).

Pure: the REST view hands over the request's JSON and the application's logical and
physical topology, and gets back the control tuple with its targets, or a refusal
with one sentence.  Two kinds of refusal protect the running job:

* ROUTING, UPSTREAM, DRAIN, ROLLBACK, KEYGROUPS, CHAIN and SWAP are steps of the stable update
  and of the guarantee's recovery: sent alone they skip the rules, the order and the
  acks those protocols wait for (a ROUTING to a worker without flows loses tuples, a
  DRAIN without the predecessors' new routes leaves them sending to a finished
  worker).  ``"force": true`` sends one anyway (tests, recovery by hand).
* INPUT_RATE, ACTIVATE and DEACTIVATE start, stop and pace a spout's emission; a
  bolt emits what its input brings, so these are refused for bolts (the worker
  would only count them as dropped): a bolt's input is paced at its spouts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from typhoon.operators import import_refusal
from typhoon.topology import PhysicalTopology, Topology
from typhoon.wire import Control, ControlTuple, encode_control

FIELDS = frozenset({"type", "body", "workers", "node", "force"})

# what to use instead of sending a protocol step alone
PROTOCOL_STEPS: dict[Control, str] = {
    Control.ROUTING: "change a route with `typhoon route` (or `scale`, `insert`, `remove`)",
    Control.UPSTREAM: "senders change with `typhoon route` or `typhoon scale`",
    Control.DRAIN: "take workers out with `typhoon scale` or `typhoon remove` (or `kill`)",
    Control.ROLLBACK: "the fault recovery rolls a guaranteed application back as a whole",
    Control.KEYGROUPS: "key groups move with `typhoon scale` of the keyed node",
    Control.CHAIN: "a chained edge goes on the network with `typhoon unchain` (back: `chain`)",
    Control.SWAP: "a node's operator changes with `typhoon swap`",
}
SPOUT_ONLY = frozenset({Control.INPUT_RATE, Control.ACTIVATE, Control.DEACTIVATE})


class ControlRequestError(Exception):
    """A request refused: ``status`` (400/404) and one sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class ControlRequest:
    """A control tuple checked against the application, ready to send."""

    tuple: ControlTuple
    workers: list[int]
    request_id: int | None = None  # METRIC_REQ: where its answers are kept

    def reply(self, sent: int) -> dict[str, Any]:
        """The 202 answer: how many were sent, to whom (and the METRIC_REQ's id)."""
        doc: dict[str, Any] = {"sent": sent, "workers": self.workers, "type": self.tuple.type.name}
        if self.request_id is not None:
            doc["request_id"] = self.request_id
        return doc


def parse_control(
    body: Any,
    name: str,
    topology: Topology,
    physical: PhysicalTopology,
    next_request_id: Callable[[], int],
) -> ControlRequest:
    """The control tuple and targets of ``body``, or ControlRequestError.

    ``{"type": T, "body": {...}, "workers": [..] | "node": N, "force": false}``;
    without ``workers`` or ``node`` every worker (the spouts' for a spout-only kind).
    A METRIC_REQ without ``request_id`` gets ``next_request_id()``.
    """
    if not isinstance(body, dict):
        raise ControlRequestError(400, "the body must be a JSON object")
    unknown = set(body) - FIELDS
    if unknown:
        raise ControlRequestError(400, f"unknown field(s): {', '.join(sorted(unknown))}")
    tname = body.get("type")
    if not isinstance(tname, str) or tname.upper() not in Control.__members__:
        raise ControlRequestError(400, f"'type' must be one of {', '.join(Control.__members__)}")
    ctype = Control[tname.upper()]
    if ctype == Control.METRIC_RESP:
        raise ControlRequestError(400, "METRIC_RESP is sent by workers, not to them")
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise ControlRequestError(400, "'force' must be true or false")
    if ctype in PROTOCOL_STEPS and not force:
        raise ControlRequestError(
            400,
            f"{ctype.name} is a step of a protocol (the stable update or the recovery) and "
            f"alone it bypasses the rules and acks that protocol waits for: "
            f'{PROTOCOL_STEPS[ctype]}; give "force": true to send it anyway',
        )
    ct_body = body.get("body", {})
    if not isinstance(ct_body, dict):
        raise ControlRequestError(400, "'body' must be a JSON object")
    if ctype == Control.SWAP:  # forced: a worker would import what it names
        trusted = {n.operator for n in topology.nodes.values()}
        refusal = import_refusal(str(ct_body.get("operator", "")), trusted)
        if refusal is not None:
            raise ControlRequestError(400, refusal)
    request_id = None
    if ctype == Control.METRIC_REQ:
        if "request_id" not in ct_body:
            ct_body = {**ct_body, "request_id": next_request_id()}
        request_id = ct_body["request_id"]
    targets = _targets(body, ctype, name, topology, physical)
    ct = ControlTuple(ctype, ct_body)
    try:
        encode_control(ct)
    except (ValueError, TypeError) as e:
        raise ControlRequestError(400, f"bad {ctype.name} body: {e}") from None
    return ControlRequest(ct, targets, request_id if isinstance(request_id, int) else None)


def _targets(
    body: dict, ctype: Control, name: str, topology: Topology, physical: PhysicalTopology
) -> list[int]:
    ids = {w.worker_id for w in physical.workers}
    spouts = {n.name for n in topology.spouts()}
    if "workers" in body and "node" in body:
        raise ControlRequestError(400, "give 'workers' or 'node', not both")
    if "node" in body:
        node = body["node"]
        if not isinstance(node, str) or node not in topology.nodes:
            raise ControlRequestError(404, f"no node named '{node}' in '{name}'")
        targets = [w.worker_id for w in physical.of_node(node)]
    elif "workers" in body:
        targets = body["workers"]
        if not isinstance(targets, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in targets
        ):
            raise ControlRequestError(400, "'workers' must be a list of worker ids")
        missing = sorted(set(targets) - ids)
        if missing:
            raise ControlRequestError(404, f"no worker(s) {missing} in '{name}'")
    elif ctype in SPOUT_ONLY:
        return sorted(w.worker_id for w in physical.workers if w.node in spouts)
    else:
        return sorted(ids)
    if ctype in SPOUT_ONLY:
        bolts = sorted({physical.by_id(t).node for t in targets} - spouts)
        if bolts:
            raise ControlRequestError(400, _spout_only(ctype, bolts))
    return targets


def _spout_only(ctype: Control, bolts: list[str]) -> str:
    what = {
        Control.INPUT_RATE: "paces a spout's emission",
        Control.ACTIVATE: "starts a spout's emission",
        Control.DEACTIVATE: "stops a spout's emission",
    }[ctype]
    names = ", ".join(f"'{b}'" for b in bolts)
    return (
        f"{ctype.name} {what}, and {names} {'is a bolt' if len(bolts) == 1 else 'are bolts'}: "
        f"a bolt processes what its input brings, so pace or stop the spouts that feed it "
        f"(typhoon control NAME SPOUT --input-rate N | --deactivate)"
    )
