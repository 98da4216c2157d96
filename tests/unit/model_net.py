"""In-memory networks of real framework layers, for the model tests of ``tests/unit``.

Every worker of a job is a real :class:`~typhoon.runtime.framework.Framework`;
``Links`` is its I/O layer, putting frames into per-link FIFOs that keep each
link's order as the real transports do.  ``SeededNet`` drives such a network
with a seeded scheduler that interleaves deliveries and the workers' turns and
moves time (the window, join, idle-source and Nexmark models); the checkpoint
models (``test_guarantee_model.py``, ``test_keyed_migration.py``) drive theirs
themselves.  Imported by name (``tests/unit`` is on ``sys.path`` in its tests).
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable
from typing import Any

from typhoon.operators import BUILTINS
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.transport import Inbound, Transport
from typhoon.topology import Topology, load_topology_text, schedule
from typhoon.wire import Control, ControlTuple


class Links(Transport):
    """One worker's I/O layer: what it sends goes into ``net.links[(me, dst)]``."""

    def __init__(self, net: Any, me: int) -> None:
        super().__init__()
        self.net, self.me = net, me

    def poll(self, timeout: float) -> list:
        return []

    def send(self, dst: int, stream: int, payloads: list[bytes]) -> None:
        self.net.links[(self.me, dst)].append((stream, list(payloads)))

    def reply(self, ct: ControlTuple) -> None:
        pass


class SeededNet:
    """Every worker of a job (a ``Topology`` or its text) on one in-memory network,
    driven by a seeded scheduler."""

    def __init__(self, job: Topology | str, seed: int, batch_size: int = 8) -> None:
        self.rng = random.Random(seed)
        self.topo = load_topology_text(job) if isinstance(job, str) else job
        self.phys = schedule(self.topo, ["h1"], 3, first_port=10)
        self.now = 0.0
        self.links: dict[tuple[int, int], collections.deque] = collections.defaultdict(
            collections.deque
        )
        self.fws: dict[int, Framework] = {}
        for w in self.phys.workers:
            node = self.topo.nodes[w.node]
            spec = WorkerSpec(
                self.topo, self.phys, w.worker_id, batch_size=batch_size, max_delay_ms=0.0
            )
            fw = Framework(spec, BUILTINS[node.operator](**node.args), Links(self, w.worker_id),
                           clock=lambda: self.now)  # fmt: skip
            fw.now = self.now
            self.fws[w.worker_id] = fw
        for fw in self.fws.values():
            if fw.is_spout:
                fw.control(ControlTuple(Control.ACTIVATE, {}))

    def run(self, steps: int = 200_000, until: Callable[[], bool] | None = None) -> None:
        """Until every worker finished and the links are empty (or ``until()``); an
        AssertionError if that takes more than ``steps`` turns."""
        rng = self.rng
        for _ in range(steps):
            busy = [k for k, q in self.links.items() if q]
            if until is not None and until():
                return
            if all(fw.done for fw in self.fws.values()) and not busy:
                return
            self.now += rng.choice([0.0, 0.0005, 0.002])
            if busy and rng.random() < 0.7:
                src, dst = rng.choice(busy)
                stream, payloads = self.links[(src, dst)].popleft()
                fw = self.fws[dst]
                fw.now = self.now
                if not fw.done:
                    fw.deliver(Inbound(src, stream, payloads))
                continue
            fw = self.fws[rng.choice(list(self.fws))]
            fw.now = self.now
            if fw.is_spout and not fw.done:
                fw.step_spout()
            if not fw.done:
                fw.tick()
        raise AssertionError("the job did not finish")

    def results(self, node: str) -> list[list]:
        """The tuples the one ``collect`` worker of ``node`` holds."""
        (w,) = self.phys.of_node(node)
        return self.fws[w.worker_id].op.result()["tuples"]

    def metric(self, node: str, name: str) -> int:
        """A metric summed over the workers of ``node``."""
        return sum(self.fws[w.worker_id].metrics()[name] for w in self.phys.of_node(node))
