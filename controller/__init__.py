"""Typhoon's SDN controller: a thin Ryu layer over pure rule logic (docs/design.md §5).

Only `controller.framework.ryu_compat` imports Ryu; everything else imports Ryu names from it.
"""
