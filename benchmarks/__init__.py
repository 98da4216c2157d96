"""The paper's evaluation (§6), reproduced on emulated clusters: ``typhoon bench``.

Layout: ``scenario.py`` (what a scenario is, the registry, interleaved
measurement, statistics), ``scenarios/`` (one module per paper figure),
``testbed.py`` (the sdn cluster and the tcp baseline's emulated hosts, kept
up between runs), ``tcp_fabric.py`` (Mininet hosts for the baseline),
``topologies.py`` and ``operators.py`` (what the runs run), ``measure.py``
(numbers from a run), ``plots.py``, ``machine.py``, ``runner.py`` (results
directory); the ``bench`` verb's arguments are ``typhoon_cli/bench.py``.
"""
