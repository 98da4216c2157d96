"""A stream that declares its columns, over tcp: real worker processes and sockets.

``forward.yaml`` with ``columns:`` on its one stream and 100,000 tuples: the source
packs column blocks, the sink's ``sequence_check`` takes them as numpy columns
(``process_columns``), and the run's checks must still find every tuple exactly once.
"""

from __future__ import annotations

import pytest
import test_tcp_runs
from test_tcp_runs import TOPOLOGIES, run_report

import typhoon.topology

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


@pytest.mark.long
def test_exactly_once_with_columns_survives_killed_workers(tmp_path, monkeypatch):
    """``test_tcp_runs``' exactly-once wordcount with both streams declaring their
    columns (``str``): every worker SIGKILLed mid-run, the job rolls back to the
    checkpoint, the source replays and the upstream backups resend column blocks;
    the counts still equal the reference."""
    load = typhoon.topology.load_topology

    def with_columns(path, **kw):
        t = load(path, **kw)
        for s in t.streams:
            s.columns = {f: "str" for f in t.nodes[s.src].output_fields}
        return t

    monkeypatch.setattr(typhoon.topology, "load_topology", with_columns)
    test_tcp_runs.test_tcp_exactly_once_survives_killed_workers(
        tmp_path, ["source", "split", "count"]
    )


BLOCK_ROW = 8 + 8 + 8 + 100 + 4  # bytes of one of its rows in a block (int64s, payload, offset)


@pytest.mark.parametrize("mtu", [None, 9000])
def test_a_columnar_source_sends_every_tuple_as_blocks_exactly(tmp_path, mtu):
    """``forward_columns.yaml``: ``sequence_columns`` emits numpy columns
    (``emit_columns``), never rows; the sink checks them as columns.  Its frames are
    the run's tcp frame size: the sdn workers' 64,000 bytes by default (more than
    9,000-byte frames could carry), or the file's ``tcp: {mtu: 9000}``."""
    file = TOPOLOGIES / "forward_columns.yaml"
    if mtu is not None:
        file = tmp_path / "forward_columns.yaml"
        text = (TOPOLOGIES / "forward_columns.yaml").read_text()
        file.write_text(text.replace("spouts:", f"config: {{tcp: {{mtu: {mtu}}}}}\nspouts:", 1))
    r = run_report(tmp_path, file, "--arg", "source.count=100000")
    assert r["ok"], r["problems"]
    sink = r["results"]["sink"]
    assert sink["expected"] == sink["received"] == 100_000
    assert sink["missing"] == 0 and sink["duplicates"] == 0
    workers = {w["node"]: w for w in r["workers"]}
    assert workers["source"]["columns_out"] == 100_000  # every tuple left in a block ...
    assert "columns_as_rows" not in workers["source"]  # ... none as rows
    assert workers["sink"]["columns_in"] == 100_000
    assert not workers["sink"]["drops"]
    least_9000 = 100_000 * BLOCK_ROW // 9000  # frames, were every 9,000-byte frame full
    if mtu is None:
        assert workers["source"]["frames_out"] < least_9000
    else:
        assert workers["source"]["frames_out"] >= least_9000
