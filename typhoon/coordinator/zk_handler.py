"""Which kazoo handler a process's ZooKeeper session uses, eventlet or not.

Inside ``ryu-manager`` eventlet has patched the standard library; kazoo's default
threading handler then either blocks the hub in its selector (everything green) or
runs a real thread doing green I/O that misses its deadlines (sockets green,
threads not: ``--enable-debugger``), and the session drops.
"""

from __future__ import annotations

import sys
from typing import Any

from kazoo.handlers import utils as kazoo_utils
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler


def timeouts() -> tuple[type[Exception], ...]:
    """The timeout errors of kazoo's handlers (the eventlet one has its own)."""
    green = sys.modules.get("kazoo.handlers.eventlet")
    return (KazooTimeoutError, green.TimeoutError) if green else (KazooTimeoutError,)


class NativeThreadingHandler(SequentialThreadingHandler):
    """kazoo's threading handler on the socket and select modules eventlet left alone.

    With sockets patched but not threads (ryu-manager --enable-debugger), kazoo's
    connection thread is a real thread doing green I/O, which misses its
    deadlines ("socket time-out during write") and the session drops.
    """

    def __init__(self, socket_module: Any, select_module: Any) -> None:
        super().__init__()
        self._socket_module, self._select_module = socket_module, select_module

    def select(self, rlist: Any, wlist: Any, xlist: Any, timeout: float | None = None) -> Any:
        return self._select_module.select(rlist, wlist, xlist, timeout)

    def socket(self) -> Any:
        return kazoo_utils.create_tcp_socket(self._socket_module)

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        return kazoo_utils.create_tcp_connection(self._socket_module, *args, **kwargs)

    def create_socket_pair(self) -> Any:
        return kazoo_utils.create_socket_pair(self._socket_module)


def session_handler() -> Any:
    """The native handler when eventlet patched sockets but not threads; the eventlet
    handler when it patched both; kazoo's own threading handler without eventlet."""
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is None or not patcher.is_monkey_patched("socket"):
        return SequentialThreadingHandler()
    if patcher.is_monkey_patched("thread"):
        # everything green (ryu-manager without --enable-debugger): kazoo's own
        # threading handler blocks the hub in its selector and deadlocks
        from kazoo.handlers.eventlet import SequentialEventletHandler

        return SequentialEventletHandler()
    return NativeThreadingHandler(patcher.original("socket"), patcher.original("select"))
