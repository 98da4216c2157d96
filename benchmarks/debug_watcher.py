"""A live-debugger session driven as ``typhoon debug attach`` drives it, in a thread.

The live-debug benchmark (``benchmarks/scenarios/live_debug.py``) attaches one
to the source while the pipeline runs, reads its records as the CLI does and
detaches at the end; the REST API is ``apps/live_debugger.py``'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from typhoon.client import ApiCallError, Client


class Watcher:
    """The live debugger's client in a thread, as ``typhoon debug attach`` runs it."""

    POLL_S = 0.2  # the CLI's --poll default

    def __init__(
        self,
        api: Client,
        app: str,
        sample: float,
        worker: str = "source",
        direction: str = "out",
        keep: Callable[[list[dict[str, Any]]], None] | None = None,
        rate: int | str | None = None,
    ) -> None:
        self.api = api
        self.sample = sample  # percent of the decoded copies shipped to the controller
        self.worker, self.direction = worker, direction
        self.keep = keep  # called with every page of records read
        # frames/s the switch copies ("all": every frame, no meter; None: the controller's
        # default)
        self.rate = rate
        self.path = f"/apps/{app}/debug"
        self.requested = 0.0
        self.live = 0.0  # wall time the session was first seen live
        self.session: dict[str, Any] = {}
        self.final: dict[str, Any] = {}
        self.records = 0
        self.stats: dict[str, Any] = {}  # the debug worker's, at the end
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-debug", daemon=True)

    def attach(self) -> None:
        self.requested = time.time()
        body: dict[str, Any] = {
            "worker": self.worker,
            "direction": self.direction,
            "sample": self.sample,
        }
        if self.rate is not None:
            body["rate"] = self.rate
        self.session = self.api.call("POST", self.path, body)
        self._thread.start()

    def _run(self) -> None:
        sid = self.session["session"]
        try:
            while not self._stop.is_set():
                s = self.api.call("GET", f"{self.path}/{sid}")
                if s["state"] == "live":
                    self.live, self.session = time.time(), s
                    break
                if s["state"] == "ended":
                    self.error = f"the debug session ended before it went live: {s['reason']}"
                    return
                self._stop.wait(0.1)
            after = 0
            while not self._stop.is_set():
                page = self.api.call("GET", f"{self.path}/{sid}/tuples?after={after}&limit=1000")
                self.records += len(page["records"])
                if self.keep is not None:
                    self.keep(page["records"])
                after = page["next"]
                if page["state"] == "ended":
                    self.error = f"the debug session ended: {page['reason']}"
                    return
                if not page["records"]:
                    self._stop.wait(self.POLL_S)
        except ApiCallError as e:
            self.error = f"debug session: {e}"

    def detach(self) -> float:
        """Stop reading, DELETE the session (mirrors removed); the wall time it was asked."""
        at = time.time()
        self._stop.set()
        self._thread.join(timeout=10)
        if self.session:
            try:
                self.final = self.api.call("DELETE", f"{self.path}/{self.session['session']}")
            except ApiCallError as e:
                self.error = self.error or f"detach: {e}"
        return at

    def final_stats(self, wait_s: float = 5.0) -> dict[str, Any]:
        """The debug worker's last statistics: it posts them once the detach stopped it,
        after the DELETE answered (the controller keeps an ended session a while)."""
        at_detach = (self.final or {}).get("stats") or {}
        if not self.session:
            return at_detach
        deadline = time.monotonic() + wait_s
        while True:
            try:
                stats = self.api.call("GET", f"{self.path}/{self.session['session']}")["stats"]
            except ApiCallError:
                return at_detach
            if stats != at_detach or time.monotonic() > deadline:
                return stats or at_detach
            time.sleep(0.2)
