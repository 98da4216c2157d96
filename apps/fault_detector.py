"""Fault detector (paper §4, §6.2 Fig. 10): ``ryu-manager apps/fault_detector.py``.

A worker's TAP vanishes from its bridge when its process dies, and the switch
says so within milliseconds (OFPPortStatus, raised by the core as
``EventWorkerDown``).  The app then, in this order:

1. sends ROUTING to the dead worker's senders with routes that leave it out
   (``controller/recovery/fault_detector.py``), right in the event handler: every tuple a sender
   writes to the dead port until then is lost, so this is the step timed
   (``reroute_ms``, from the port event to the last PacketOut written);
   the load-balancer app drops the worker from its select group on the same
   event; the senders' acks are awaited by a task the app's timer resumes
   (``controller/waits.py``, ``reroute_acked_ms``);
2. waits (``confirm_timeout``) for the agent's exit status: a worker that
   ended with code 0 finished its input and is left alone; otherwise the
   manager writes a physical topology without it and with a replacement of the
   same node and index (fresh ID, placed by the scheduler's ``reschedule``), and
   one UPSTREAM tells the receivers to expect the replacement instead;
3. once the agent reports the replacement attached and the switches hold its
   rules, sends UPSTREAM to the replacement, then ROUTING with it to the
   senders (a replaced source is ACTIVATEd).

All of it is the state machine in ``controller/recovery/fault_detector_machine.py``;
this file only feeds it Ryu's events and timers.

The fallback: a worker whose METRIC_RESP stopped arriving for
``heartbeat_timeout`` seconds is handled the same way (its agent stops it when
the new physical topology leaves it out), unless a receiver of it is silent or
being failed over too: a sender waiting for a hung receiver's credit does not
answer either, and only the receiver is dead.  Silence counts only while
other workers are heard (``controller/recovery/fault_detector.py``, ``Heartbeats``): a stalled
controller has heard nobody.  A worker its agent saw crash
(non-zero exit) stays watched, so a missed port event is still caught.  With
``port_events = false`` the heartbeat is the only detector: the Storm-like
baseline the benchmarks compare port events against (paper Fig. 10).

Updates of an application the reconfiguration executor is changing are left
to the executor, and so are workers that end normally: a port that goes down
after the worker's METRIC_RESP said ``done``, or whose agent reports exit code
0, is an end of stream.

Every decision is logged with its reason; ``GET /typhoon/faults`` (served by
the core, ``controller/core_recovery.py``) lists the incidents with their times.
Without this app the core still recovers applications that ask for a processing
guarantee, with the same machine and settings; with it, this app handles them all.

Settings: section ``[fault_detector]`` of the Ryu config file, declared once by
``FaultSettings`` in ``controller/recovery/fault_detector.py``
(``controller/settings.py``); the table is in ``docs/fault_detector.md``.
"""

from __future__ import annotations

from typing import Any

from controller.app_support import EventTick, TyphoonApp, start_ticks, start_timer
from controller.events import EventWorkerDown, EventWorkerMetrics
from controller.framework.ryu_compat import (
    event,
    require_app,
    set_ev_cls,
)
from controller.options import read_settings, register_settings
from controller.recovery.fault_detector import FaultSettings
from controller.recovery.fault_detector_machine import FaultMachine
from controller.services import services
from controller.settings import CoreSettings

require_app("controller.core")

register_settings(FaultSettings)

TICK_S = 0.5  # heartbeats
STEP_S = 0.01  # waiting failovers: acks, exit statuses, attachments


class EventStep(event.EventBase):
    """Timer: resume the failovers whose wait is over."""


class _LazyServices:
    """The core's services, looked up on use: Ryu may start the core after this app."""

    def __getattr__(self, name: str) -> Any:
        return getattr(services(), name)


class FaultDetector(TyphoonApp):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conf = read_settings(FaultSettings)
        metrics_interval = read_settings(CoreSettings).metrics_interval
        self.machine = FaultMachine(self.conf, _LazyServices(), metrics_interval, self.logger)
        start_ticks(self, TICK_S)
        start_timer(self, STEP_S, EventStep)
        self.machine.resume_recoveries()
        self.logger.info(
            "fault detector ready: heartbeat_timeout=%g s confirm_timeout=%g s replace=%s "
            "port_events=%s",
            self.conf.heartbeat_timeout, self.conf.confirm_timeout, self.conf.replace,
            self.conf.port_events,
        )  # fmt: skip

    @set_ev_cls(EventWorkerDown)
    def _worker_down(self, ev):
        self.machine.worker_down(ev.app, ev.worker_id, ev.host, ev.port, ev.reason, ev.at)

    @set_ev_cls(EventWorkerMetrics)
    def _metrics(self, ev):
        self.machine.metrics(ev.app, ev.worker_id, ev.metrics, ev.at)

    @set_ev_cls(EventTick)
    def _tick(self, ev):
        self.machine.tick()

    @set_ev_cls(EventStep)
    def _step(self, ev):
        self.machine.step()

    @property
    def incidents(self) -> list[Any]:
        """For ``GET /metrics`` (``controller/metrics.py``)."""
        return self.machine.incidents

    def report(self) -> list[dict[str, Any]]:
        """What died, why, and how long each step took (``GET /typhoon/faults``)."""
        return self.machine.report()
