"""Live debugger, host side (paper §4): filter language, debug worker, its supervisor.

The controller side (sessions, mirror rules, REST) is in ``controller/`` and
``apps/live_debugger.py``; what both sides share (the session spec written to
the coordinator, the filter language) lives here, in the core layer; the
``typhoon debug`` verb is ``typhoon_cli/debug.py``.
"""
