"""Typhoon's SDN controller: a thin Ryu layer over pure rule logic (docs/design.md §5).

Two rooms (docs/architecture.md, "The rooms of controller/"): `controller.rules`
computes what every switch should hold, in pure Python; `controller.framework` is
the Ryu/os-ken boundary, and `controller.framework.ryu_compat` is the module the
rest takes Ryu names from.  Neither room imports the glue here.
"""
