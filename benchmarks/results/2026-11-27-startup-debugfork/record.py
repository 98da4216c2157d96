"""The result file both measurement scripts of this directory write: every row, each
column's median (over the rows that have a value), when, and what else the run says.

Imported by ``measure_attach.py`` and ``measure_engine.py`` from their own directory
(a script's directory is the first entry of ``sys.path``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def write_record(out_path: Path, rows: list[dict[str, Any]], **about: Any) -> None:
    """``OUT.json``: ``when``, ``about``'s entries, ``rows`` and ``median``; the medians
    are printed to stderr too."""
    med = {}
    for k in rows[0]:
        vals = [r[k] for r in rows if r[k] is not None]
        med[k] = round(statistics.median(vals), 3) if vals else None
    record = {"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), **about}
    out_path.write_text(json.dumps({**record, "rows": rows, "median": med}, indent=1))
    print(json.dumps(med), file=sys.stderr)
