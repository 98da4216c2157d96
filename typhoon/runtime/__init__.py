"""Worker runtime: application, framework and I/O layers (paper Fig. 4)."""
