"""Control-plane apps, each loadable with `ryu-manager apps/<name>.py` (DESIGN.md §6)."""
