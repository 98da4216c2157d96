"""A stream that declares its columns, over tcp: real worker processes and sockets.

``forward.yaml`` with ``columns:`` on its one stream and 100,000 tuples: the source
packs column blocks, the sink's ``sequence_check`` takes them as numpy columns
(``process_columns``), and the run's checks must still find every tuple exactly once.
"""

from __future__ import annotations

import pytest
from test_tcp_runs import TOPOLOGIES, run_report

pytestmark = pytest.mark.slow

COLUMNS = "columns: {src: int64, seq: int64, ts: float64, payload: bytes}"


def test_forward_with_declared_columns_is_exact(tmp_path):
    text = (TOPOLOGIES / "forward.yaml").read_text()
    file = tmp_path / "forward_columns.yaml"
    file.write_text(text.replace("grouping: shuffle", f"grouping: shuffle\n    {COLUMNS}"))
    r = run_report(tmp_path, file, "--arg", "source.count=100000")
    assert r["ok"], r["problems"]
    sink = r["results"]["sink"]
    assert sink["expected"] == sink["received"] == 100_000
    assert sink["missing"] == 0 and sink["duplicates"] == 0
    workers = {w["node"]: w for w in r["workers"]}
    assert workers["sink"]["columns_in"] == 100_000  # every tuple came in a column block
    assert "columns_unfit" not in workers["source"]  # (shown only when rows did not fit)
    assert not workers["sink"]["drops"]
