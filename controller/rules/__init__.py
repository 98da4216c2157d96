"""What every switch should hold, computed in pure Python (no Ryu, no os-ken, no socket).

The room of rule compilation: the cluster view (:mod:`.view`) in, rule, group and
meter specs per bridge out (:mod:`.flows`, :mod:`.groups`, :mod:`.meters`,
:mod:`.mirror`, :mod:`.dead_addresses`), tagged with cookies (:mod:`.cookies`),
merged from every source (:mod:`.composer`) and diffed against what a switch
holds (:mod:`.reconcile`).  Nothing here imports the rest of ``controller/``
(tests/unit/test_layering.py), so a rule change touches this room only; the
Ryu layer (``controller/ofp.py``, ``controller/switch_sync.py``) turns the specs
into OpenFlow messages and sends them.
"""
