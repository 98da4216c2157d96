"""The framework as its parts see it: the state and the methods they share.

:class:`typhoon.runtime.framework.Framework` is one class of mixins, each in its own
module: output (``output.py``), control tuples (``control.py``), guaranteed processing
(``guarantee.py``), upstream backup (``upstream_backup.py``), checkpoints of moving key
groups (``keyed_cut.py``), key-group moves (``migration.py``) and watermarks
(``watermarks.py``).  Each reads state the framework sets and calls methods of the
others; :class:`FrameworkParts` declares all of it, and each mixin has it as its base
for a type checker only (at run time the base is ``object``: the stubs here must never
shadow a sibling's method).  ``tests/unit/test_mixin_needs.py`` checks the declaration
against the code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from typhoon.topology.model import DEFAULT_STREAM

if TYPE_CHECKING:
    from typhoon.operators.base import Context, Operator
    from typhoon.runtime.checkpoints import Checkpointer
    from typhoon.runtime.columnar import ColumnPath
    from typhoon.runtime.keyed_state import KeyedStates
    from typhoon.runtime.pairs import PairStats
    from typhoon.runtime.policies import Router
    from typhoon.runtime.spec import WorkerSpec
    from typhoon.runtime.transport import Inbound, Transport
    from typhoon.topology.model import Node
    from typhoon.topology.routing import Route


class FrameworkParts(Protocol):
    """What the framework's mixins use of it and of each other."""

    # the worker (framework.py)
    spec: WorkerSpec
    worker_id: int
    node: Node
    is_spout: bool
    op: Operator
    context: Context
    io: Transport  # under upstream backup, a BackedTransport around it
    now: float
    routers: dict[int, Router]
    routes: dict[str, list[Router]]
    upstream: set[int]
    pending_upstream: set[int]
    finished_upstream: set[int]
    # a spout's pace and life, the end of the input
    active: bool
    draining: bool
    done: bool
    input_done: bool
    # batching (output.py)
    batch_size: int
    max_delay: float
    entry_cap: int
    out: dict[tuple[int, int], list[list[Any]]]
    out_since: dict[tuple[int, int], float]
    ready: dict[tuple[int, int], list[list[Any]]]
    # streams that declare columns (typhoon.runtime.columnar), None if none does
    columnar: ColumnPath | None
    ready_since: dict[tuple[int, int], float]
    flat_out: bool
    # the next workers of our chain: receiver ID -> its framework (rows by function call)
    chained: dict[int, Any]
    # counts for the metrics and the run report
    tuples_in: dict[int, int]
    sent_to: dict[tuple[int, int], int]
    received_from: dict[tuple[int, int], int]
    sent_balanced: dict[int, int]
    serializations: int
    unrouted: int
    proc_ns: int
    proc_count: int
    in_bytes: int
    # the operator's optional hooks (framework.py)
    _pump: Callable[..., bool] | None
    _op_metrics: Callable[[], dict[str, Any]] | None
    _anchor_ready: Callable[[int], bool] | None
    pairs: PairStats | None
    # guaranteed processing (guarantee.py): None/0 without a guarantee
    ckpt: Checkpointer | None
    gen: int
    epoch: int | None
    interval: float
    anchors: dict[int, set[int]]
    left_upstream: set[int]
    # keyed state and its moves (migration.py; Any: migration.Migration imports this)
    keyed: KeyedStates | None
    migration: Any
    moved_to: int | None
    held_rows: list[tuple[int, int, list[Any]]]
    hold_from: int | None
    holding: dict[int, int]
    holding_keys: dict[str, int]

    # framework.py
    def deliver(self, item: Inbound) -> None: ...
    def install_route(self, route: Route) -> None: ...
    def release(self, workers: list[int] | tuple[int, ...]) -> None: ...
    def end_of_input(self) -> None: ...
    def finish(self) -> None: ...
    def _run(self, rows: list[list[Any]]) -> None: ...
    def _eos_from(self, src: int) -> None: ...
    # output.py
    def emit(self, values: list[Any], stream: str = DEFAULT_STREAM) -> None: ...
    def emit_rows(self, rows: list[list[Any]], stream: str = DEFAULT_STREAM) -> None: ...
    def flush(self, force: bool = False) -> None: ...
    def push(self, hold: bool = False) -> None: ...
    def set_batch_size(self, size: int) -> None: ...
    def _route_rows(self, r: Router, rows: list[list[Any]], n: int) -> None: ...
    # output_columns.py
    def _column_metrics(self) -> dict[str, Any]: ...
    # control.py
    def _ack(self, what: str, version: int) -> None: ...
    # guarantee.py
    def _align(self) -> None: ...
    def rollback(self, gen: int, epoch: int | None) -> None: ...
    def _announced(self, added: set[int], removed: list[int]) -> None: ...
    def job_complete(self) -> None: ...
    def _broadcast_punctuation(self, payload: bytes, targets: list[int]) -> None: ...
    def _guarantee_metrics(self) -> dict[str, Any]: ...
    # upstream_backup.py
    def replay(
        self, gen: int, epoch: int | None, receivers: list[int], links: list[int] | None = None
    ) -> bool: ...
    def _unrouted(self, r: Router, values: list[Any]) -> None: ...
    def _backup_reset(self, epoch: int | None) -> None: ...
    def _backup_metrics(self) -> dict[str, Any]: ...
    # keyed_cut.py
    def _note_anchor(self, src: int, epoch: int) -> None: ...
    def _anchored(self, epoch: int) -> set[int]: ...
    def _cut_fields(self, epoch: int) -> dict[str, Any] | None: ...
    def _restore_keyed(self, epoch: int, saved: dict[str, Any]) -> None: ...
    def _moved_in(self, shipped_after: int | None) -> None: ...
    def _reset_cut(self) -> None: ...
    def _cut_metrics(self) -> dict[str, Any]: ...
    # migration.py
    def keygroups(self, body: dict[str, Any]) -> None: ...
    def send_handoffs(self, stream: int, migration: int, hops: list[int]) -> None: ...
    def _handoff_from(self, src: int, stream: int | None, migration: int | None) -> None: ...
    def _migration_metrics(self) -> dict[str, Any]: ...
    # watermarks.py
    def watermark_released(self) -> None: ...
    def _watermark_from(self, src: int, payload: bytes) -> None: ...
    def _holding(self) -> bool: ...
    def _reset_watermarks(self) -> None: ...
    def _event_time(self) -> bool: ...
    def _watermark_metrics(self) -> dict[str, Any]: ...
