"""Load balancing's policy: a balanced node's weights and which senders use its address.

Pure (no Ryu, no switch): the app (``apps/load_balancer.py``) feeds :mod:`.balancer`
the workers' METRIC_RESPs and the switches' counters, and :mod:`.senders` the groups
the bridges hold, and sends what they return through the core's services.  A policy
change touches this room only (tests/unit/test_layering.py keeps it off the core).
"""
