"""The autoscaler's policy: when a node scales out or in (paper §4, §6.2 Fig. 11).

Pure: the app (``apps/autoscaler.py``) feeds :mod:`.autoscaler` metric samples and the
clock and executes the decisions it returns through the core's services.
"""
