"""Typhoon: SDN-enhanced stream processing (shared core: wire format, topology, runtime, CLI)."""

__version__ = "0.1.0"
