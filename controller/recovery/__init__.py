"""Fault handling: detect a dead worker, reroute at once, replace it, and recover its state.

:mod:`.fault_detector` decides (pure functions of the topologies);
:mod:`.fault_detector_machine` is the state machine the app ``apps/fault_detector.py``
(and, for guaranteed jobs, ``controller/core_recovery.py``) feeds with events and the
clock; :mod:`.fault_failover`, :mod:`.fault_recovery`, :mod:`.partial_recovery` and
:mod:`.region_recovery` are its slow parts, run as tasks (``controller/waits.py``);
:mod:`.fault_core` declares what they need of the controller, so nothing here imports
the core.
"""
