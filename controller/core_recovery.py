"""A guarantee brings its own recovery: the core fails over guaranteed applications.

A topology with ``config: guarantee`` is only as good as the recovery behind it:
without one, a SIGKILLed worker stops the job, whatever the checkpoints hold.
So the core runs the fault detector's state machine
(``controller/recovery/fault_detector_machine.py``) itself, for guaranteed applications
only, whenever ``apps/fault_detector.py`` is not loaded.  Loaded, that app
handles every application (guaranteed ones included) and this part stays idle:
one machine acts on a dead worker, never two.  The settings are the app's
(section ``[fault_detector]``), the incidents are served at the same URL
(``GET /typhoon/faults``), and the dashboard and ``GET /metrics`` read them too.

A mixin of :class:`controller.core.TyphoonController`, which holds the state it uses.
"""

from __future__ import annotations

from typing import Any

from controller.app_support import list_rest, start_timer
from controller.framework.ryu_compat import event, lookup_service_brick, set_ev_cls
from controller.options import read_settings, register_settings
from controller.recovery.fault_detector import FaultSettings, no_recovery
from controller.recovery.fault_detector_machine import FaultMachine
from controller.services import Services
from typhoon.checkpoint.progress import guaranteed

register_settings(FaultSettings)

FAULT_APP = "FaultDetector"  # apps/fault_detector.py's Ryu name
TICK_S = 0.5  # heartbeats, as in the app
STEP_S = 0.01  # waiting failovers


class EventRecoveryTick(event.EventBase):
    """Timer: the built-in recovery's heartbeat check."""


class EventRecoveryStep(event.EventBase):
    """Timer: resume the built-in recovery's waiting failovers."""


def _guaranteed(app: Any) -> bool:
    return guaranteed(app.topology)


class _Faults:
    """What ``GET /typhoon/faults`` reads: the app's incidents, else the core's."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.logger = core.logger

    def report(self) -> list[dict[str, Any]]:
        app = lookup_service_brick(FAULT_APP)
        if app is not None:
            return app.report()
        machine = self.core.recovery
        return machine.report() if machine is not None else []


class BuiltinRecovery:
    """The core's recovery of guaranteed applications (see the module docstring)."""

    def _init_recovery(self, wsgi: Any) -> None:
        self.recovery: FaultMachine | None = None
        self._recovery_decided = False
        wsgi.register(list_rest("faults"), {"app": _Faults(self)})

    def _decide_recovery(self) -> None:
        """Once, on the first coordinator poll (every app is instantiated by then):
        recover guaranteed applications here unless the fault detector app is loaded."""
        if self._recovery_decided:
            return
        self._recovery_decided = True
        if lookup_service_brick(FAULT_APP) is not None:
            self.logger.info("apps/fault_detector.py is loaded: it recovers every application")
            return
        conf = read_settings(FaultSettings)
        self.recovery = FaultMachine(
            conf, Services(self), self.settings.metrics_interval, self.logger, scope=_guaranteed
        )
        start_timer(self, TICK_S, EventRecoveryTick)
        start_timer(self, STEP_S, EventRecoveryStep)
        self.recovery.resume_recoveries()
        self.logger.info(
            "built-in recovery of guaranteed applications (apps/fault_detector.py not loaded): "
            "heartbeat_timeout=%g s confirm_timeout=%g s",
            conf.heartbeat_timeout, conf.confirm_timeout,
        )  # fmt: skip

    def recovery_refusal(self, topology: Any) -> str:
        """Why a guaranteed ``topology`` cannot be recovered here ('' if it can): the
        REST submit refuses it in that sentence (``controller/rest.py``)."""
        return no_recovery(topology, read_settings(FaultSettings))

    def _recovery_worker_down(
        self, app: str, wid: int, host: str, port: int, reason: str, at: float
    ) -> None:
        if self.recovery is not None:
            self.recovery.worker_down(app, wid, host, port, reason, at)

    def _recovery_metrics(self, app: str, wid: int, metrics: dict, at: float) -> None:
        if self.recovery is not None:
            self.recovery.metrics(app, wid, metrics, at)

    @set_ev_cls(EventRecoveryTick)
    def _recovery_tick(self, ev):
        if self.recovery is not None:
            self.recovery.tick()

    @set_ev_cls(EventRecoveryStep)
    def _recovery_step(self, ev):
        if self.recovery is not None:
            self.recovery.step()
