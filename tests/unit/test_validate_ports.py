"""``typhoon validate`` prints the ports the manager really gives (issue 34, item 7)."""

from __future__ import annotations

import re
from pathlib import Path

import typhoon_cli as cli
from typhoon.cluster import FIRST_WORKER_PORT, Cluster, HostInfo
from typhoon.coordinator import SqliteCoordinator
from typhoon.manager import Manager
from typhoon.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]
WORDCOUNT = ROOT / "topologies" / "wordcount.yaml"
LINE = re.compile(r"  worker (\d+): (\w+)\[(\d+)\] on (h\d+) port (\d+)$")


def test_validate_prints_the_ports_the_manager_assigns(capsys, tmp_path):
    assert cli.main(["validate", str(WORDCOUNT), "--hosts", "3"]) == 0
    printed = {
        (int(m[1]), m[2], int(m[3]), m[4], int(m[5]))
        for line in capsys.readouterr().out.splitlines()
        if (m := LINE.match(line))
    }
    c = SqliteCoordinator(tmp_path / "coord.db")
    try:
        c.put_cluster(
            Cluster({h: HostInfo(h, f"br{h}", i + 1) for i, h in enumerate(["h1", "h2", "h3"])})
        )
        physical = Manager(c).submit(load_topology(WORDCOUNT))
    finally:
        c.close()
    placed = {(w.worker_id, w.node, w.index, w.host, w.port) for w in physical.workers}
    assert printed == placed
    assert min(p[4] for p in printed) == FIRST_WORKER_PORT
