"""Typhoon's SDN controller: a thin Ryu layer over pure rule logic (docs/design.md §5).

Rooms (docs/architecture.md, "The rooms of controller/"): `controller.rules`
computes what every switch should hold, in pure Python; `controller.framework` is
the Ryu/os-ken boundary, and `controller.framework.ryu_compat` is the module the
rest takes Ryu names from; each app's policy is a room of its own
(`controller/load_balancing/`, `autoscaling/`, `locality/`, `debugging/`,
`recovery/`).  The core's glue stays here (`core.py`, `services.py`, `rest.py`,
...); no room imports it back.
"""
