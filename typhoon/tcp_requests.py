"""What a tcp run accepts of a reconfiguration request, and its ``typhoon run`` options.

The tcp runner (``typhoon/tcp_reconfig.py``) runs the sdn plan without a
controller, so some verbs have no tcp counterpart: :func:`tcp_refusal` says so
in one sentence before anything starts, and the CLI checks ``--scale``,
``--unchain`` and ``--chain`` with the parsers here.
"""

from __future__ import annotations

from typhoon.reconfig import MAX_PARALLELISM, ReconfigError, Reroute, Scale, Swap, describe
from typhoon.reconfig.edit import scaled_together
from typhoon.reconfig.requests import Chain, Request, Unchain
from typhoon.topology.chaining import chained_nodes
from typhoon.topology.model import Node, Topology


def tcp_refusal(topology: Topology, request: Request) -> str | None:
    """One sentence saying why tcp refuses ``request`` on ``topology``; None: it may run."""
    if isinstance(request, (Unchain, Chain)):
        return None  # the processes stay; the plan says what is wrong with it
    if isinstance(request, Reroute) and request.policy == "direct":
        # a locality move (senders route by the table themselves, the plan checks it); on
        # a chained edge the plan unchains the edge live first (typhoon.reconfig.chains)
        return None
    if isinstance(request, Swap) and request.node in topology.nodes:
        if request.node in chained_nodes(topology) or topology.nodes[request.node].keyed:
            return None  # in place, or refused by the runner (typhoon.reconfig.swap_in_place)
    if not isinstance(request, Scale):
        return (
            f"{describe(request)} needs --transport sdn: a tcp run takes only 'scale', "
            "'unchain', 'chain', a 'direct' reroute (a locality move) and a swap in place "
            "(of a chained node, or of a node with keyed state; other reroutes and swaps, "
            "insert, remove and move need the sdn controller)"
        )
    node = topology.nodes.get(request.node)
    if node is None:
        return f"no node named '{request.node}' in '{topology.name}'"
    # a chained node scales its whole chain (typhoon.reconfig.edit.scaled_together), each
    # node of it checked here
    try:
        together = scaled_together(topology, node.name)
    except ReconfigError as e:  # a chain that starts at a spout
        return e.message
    for name in together:
        refusal = _scale_refusal(topology.nodes[name])
        if refusal is not None:
            return refusal
    return None


def _scale_refusal(node: Node) -> str | None:
    if node.engine != "python":
        return (
            f"{node.engine} node '{node.name}' cannot be rescaled on tcp: the tcp runner "
            "starts one engine service per host at launch and never changes it"
        )
    if node.stateful and not node.keyed:  # its input remaps: the plan would flush it
        return (
            f"'{node.name}' keeps per-worker state that is not keyed (stateful: true with "
            f"operator {node.operator}), which a tcp rescale cannot move: only keyed state "
            "moves with its key groups on tcp (docs/keyed_state.md)"
        )
    return None


def parse_scale_option(text: str) -> tuple[float, Scale]:
    """``AT:NODE=N`` (``typhoon run --scale``): at AT seconds, scale NODE to N workers."""
    at, sep, rest = text.partition(":")
    node, eq, n = rest.partition("=")
    try:
        seconds, parallelism = float(at), int(n)
    except ValueError:
        seconds, parallelism = -1.0, 0
    if not sep or not eq or not node or seconds < 0 or not 1 <= parallelism <= MAX_PARALLELISM:
        raise ValueError(
            f"--scale '{text}' is not of the form AT:NODE=N (AT seconds >= 0, "
            f"1 <= N <= {MAX_PARALLELISM}), e.g. 5:count=6"
        )
    return seconds, Scale(node, parallelism)


def parse_chain_option(text: str, verb: str) -> tuple[float, Unchain | Chain]:
    """``AT:NODE`` or ``AT:NODE:WORKER`` (``typhoon run --unchain`` / ``--chain``): at AT
    seconds, put NODE's chained edges on the network (``verb`` "unchain") or make them
    function calls again ("chain"); only WORKER's chain instance when given."""
    at, sep, rest = text.partition(":")
    node, _, worker = rest.partition(":")
    try:
        seconds, wid = float(at), int(worker) if worker else None
    except ValueError:
        seconds, wid = -1.0, None
    if not sep or not node or seconds < 0 or (worker and (wid is None or wid < 1)):
        raise ValueError(
            f"--{verb} '{text}' is not of the form AT:NODE or AT:NODE:WORKER (AT seconds "
            f">= 0, WORKER a worker ID), e.g. 5:split"
        )
    return seconds, (Unchain if verb == "unchain" else Chain)(node, wid)
