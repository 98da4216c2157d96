"""Control-plane apps, each loadable with `ryu-manager apps/<name>.py` (docs/design.md §6)."""
