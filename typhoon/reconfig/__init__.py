"""Dynamic topology manager: a reconfiguration request -> the steps of a stable update.

Pure logic (paper §3.2 last part, §3.5, Fig. 6; docs/design.md §5): it reads nothing
and sends nothing.  ``requests`` checks a JSON request, ``edit`` builds and
checks the new logical topology, ``plan`` turns both and the running
application into a :class:`Plan`: the physical topology *during* the update
(new workers added, removed ones ``draining``: they keep their rules and
process, no route sends to them), the final one, and the ordered steps the
controller's executor (``controller/reconfigure.py``) runs, each confirmed
before the next.

One procedure serves every request (scale, reroute, swap, insert, remove, move),
because each one is "some workers join, some leave, some routes change":

1. keep the old rules while the update runs (make before break: a stream
   that disappears or changes to/from ``all`` still has its rules);
2. write the new topology and the transition physical topology; agents
   launch the new workers (wait: ``attached``); the controller installs their
   rules (wait: barrier answered);
3. UPSTREAM to staying workers that get new senders, so that none finishes
   before the newcomers' end of stream (acked);
4. stateful receivers (``stateful: true``, key-routed in-memory cache): SIGNAL
   flush before the remap (paper), ROUTING, SIGNAL flush again: what came in
   under the old key mapping leaves the cache before the new mapping fills it,
   so no key's partial state is split across the remap;
5. ROUTING to the staying senders whose routes change (acked); keyed state
   moves around it (KEYGROUPS prepare / finish), in rounds of a few key groups
   when it can (``steps``: Megaphone's stepwise migration);
6. *commit*: the point of no return.  Up to here everything is undone on
   failure; after it the update only goes forward;
7. ROUTING again with ``release``: every sender sends end of stream to the
   receivers it dropped, right after its last tuple (acked);
8. DRAIN the removed workers (acked, or exited cleanly), write the final
   physical topology, wait until their agents stopped them, drop the old rules.
"""

from typhoon.reconfig.edit import apply_request, check_topology, find_stream, topology_document
from typhoon.reconfig.plan import ACTIONS, Plan, Step, plan
from typhoon.reconfig.requests import (
    KINDS,
    MAX_PARALLELISM,
    Insert,
    Move,
    ReconfigError,
    Remove,
    Request,
    Reroute,
    Scale,
    Swap,
    describe,
    parse_request,
)

__all__ = [
    "ACTIONS",
    "KINDS",
    "MAX_PARALLELISM",
    "Insert",
    "Move",
    "Plan",
    "ReconfigError",
    "Remove",
    "Request",
    "Reroute",
    "Scale",
    "Step",
    "Swap",
    "apply_request",
    "check_topology",
    "describe",
    "find_stream",
    "parse_request",
    "plan",
    "topology_document",
]
