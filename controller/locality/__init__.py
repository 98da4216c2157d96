"""The locality router's policy: which keys move next to their partners (issue 17).

:mod:`.router` plans the reroutes from the workers' METRIC_RESPs and the topologies;
:mod:`.job` is one run of it on one application, advanced by the app's timer
(``apps/locality_router.py``; the tcp transport drives the same job from
``typhoon_cli/tcp_locality.py``).
"""
