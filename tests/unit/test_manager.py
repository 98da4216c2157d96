"""Streaming manager over a real (SQLite) coordinator: admission, placement, kill, update."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from typhoon.cluster import Cluster, HostInfo
from typhoon.coordinator import AgentState, CoordinatorError, SqliteCoordinator, WorkerStatus
from typhoon.manager import Manager, ManagerError
from typhoon.reconfig import Scale
from typhoon.topology import app_id_for, load_topology_text, reschedule

PIPELINE = """
name: {name}
spouts:
  - id: source
    operator: sentence_source
    args: {{count: 10}}
bolts:
  - id: split
    operator: split_words
    parallelism: {split}
  - id: count
    operator: count_by_key
    parallelism: 2
streams:
  - from: source
    to: split
    grouping: shuffle
  - from: split
    to: count
    grouping: {{type: fields, fields: [word]}}
"""


def pipeline(name: str = "wc", split: int = 3):
    return load_topology_text(PIPELINE.format(name=name, split=split))


@pytest.fixture
def coord(tmp_path: Path) -> Iterator[SqliteCoordinator]:
    c = SqliteCoordinator(tmp_path / "coord.db")
    c.put_cluster(Cluster({h: HostInfo(h, f"br-{h}", i + 1) for i, h in enumerate(["h1", "h2"])}))
    yield c
    c.close()


@pytest.fixture
def manager(coord: SqliteCoordinator) -> Manager:
    return Manager(coord)


def ports(physical) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for w in physical.workers:
        out.setdefault(w.host, []).append(w.port)
    return out


def test_submit_writes_logical_state_then_physical(manager: Manager, coord) -> None:
    v = coord.version()
    physical = manager.submit(pipeline())
    claim = f"appid/{app_id_for('wc'):04x}"  # between the name and the rest (issue 28)
    assert coord.changes_since(v)[1] == ["topology/wc", claim, "state/wc", "physical/wc"]
    assert coord.get_topology("wc") == pipeline()
    assert coord.get_physical("wc") == physical
    assert "active" not in coord.get_app_state("wc")  # the controller activates
    assert physical.app_id == app_id_for("wc")
    assert [w.worker_id for w in physical.workers] == [1, 2, 3, 4, 5, 6]
    assert ports(physical) == {"h1": [100, 101, 102], "h2": [100, 101, 102]}


def test_submit_replaces_a_stale_application_state(manager: Manager, coord) -> None:
    coord.put_app_state("wc", {"active": True})  # written by a controller after a kill
    manager.submit(pipeline())
    assert "active" not in coord.get_app_state("wc")


def test_submit_refuses_a_duplicate_name(manager: Manager) -> None:
    manager.submit(pipeline())
    with pytest.raises(ManagerError, match="'wc' is already running; kill it first"):
        manager.submit(pipeline(split=1))


def test_submit_needs_a_cluster(tmp_path: Path) -> None:
    with SqliteCoordinator(tmp_path / "empty.db") as c:
        with pytest.raises(ManagerError, match="no cluster"):
            Manager(c).submit(pipeline())
        assert c.topology_names() == []


def test_ports_start_at_the_highest_first_worker_port(manager: Manager, coord) -> None:
    coord.put_cluster(Cluster({"h1": HostInfo("h1", "b1", 1), "h2": HostInfo("h2", "b2", 2, 200)}))
    assert ports(manager.submit(pipeline())) == {"h1": [200, 201, 202], "h2": [200, 201, 202]}


def test_applications_on_the_same_hosts_get_disjoint_ports(manager: Manager) -> None:
    a = manager.submit(pipeline("a"))
    b = manager.submit(pipeline("b", split=1))
    assert ports(b) == {"h1": [103, 104], "h2": [103, 104]}
    c = manager.submit(pipeline("c", split=5))
    used = [(w.host, w.port) for p in (a, b, c) for w in p.workers]
    assert len(used) == len(set(used))


def test_ports_freed_by_kill_are_reused_once_agents_release_them(manager: Manager, coord) -> None:
    manager.submit(pipeline("a"))
    manager.kill("a")
    coord.put_agent(AgentState("h1", 1, 0.0, (100, 0xFEFF), [100, 101], {"a": [1, 2]}))
    assert ports(manager.submit(pipeline("b"))) == {"h1": [102, 103, 104], "h2": [102, 103, 104]}
    coord.put_agent(AgentState("h1", 1, 0.0, (100, 0xFEFF), [], {}))
    assert ports(manager.submit(pipeline("c", split=1))) == {"h1": [100, 101], "h2": [100, 101]}


def test_submit_refuses_while_a_previous_incarnation_drains(manager: Manager, coord) -> None:
    manager.submit(pipeline())
    manager.kill("wc")
    coord.put_agent(AgentState("h2", 1, 0.0, (100, 0xFEFF), [100], {"wc": [4]}))
    with pytest.raises(ManagerError, match="still stopping on h2"):
        manager.submit(pipeline())
    assert manager.wait_stopped("wc", timeout=0.2) is False
    coord.put_agent(AgentState("h2", 1, 0.0, (100, 0xFEFF), [], {}))
    assert manager.wait_stopped("wc", timeout=1)
    manager.submit(pipeline())


def test_submit_refuses_an_application_id_collision(manager: Manager) -> None:
    seen: dict[int, str] = {}
    for i in itertools.count():
        name = f"app{i}"
        if app_id_for(name) in seen:
            first, second = seen[app_id_for(name)], name
            break
        seen[app_id_for(name)] = name
    manager.submit(pipeline(first, split=1))
    with pytest.raises(ManagerError, match=f"already used by '{first}'; rename"):
        manager.submit(pipeline(second, split=1))
    assert manager.list() == [first]


def test_kill_removes_the_physical_topology_first(manager: Manager, coord) -> None:
    physical = manager.submit(pipeline())
    manager.submit(pipeline("other", split=1))
    for w in physical.workers:
        coord.put_worker_status("wc", WorkerStatus(w.worker_id, w.host, "attached"))
        coord.put_metrics("wc", w.worker_id, {"tuples": 1})
    v = coord.version()
    manager.kill("wc")
    keys = coord.changes_since(v)[1]
    assert keys[0] == "physical/wc"
    assert [k for k in coord.list() if "wc" in k] == []
    assert manager.list() == ["other"]
    with pytest.raises(ManagerError, match="no application named 'wc'"):
        manager.kill("wc")


def test_get_and_list(manager: Manager, coord) -> None:
    assert manager.list() == []
    physical = manager.submit(pipeline())
    coord.put_worker_status("wc", WorkerStatus(2, "h1", "attached", port=101))
    app = manager.get("wc")
    assert app.name == "wc" and app.physical == physical
    assert set(app.state) == {"submitted"}
    assert list(app.statuses) == [2]
    assert manager.list() == ["wc"]
    with pytest.raises(ManagerError, match="no application named 'nope'"):
        manager.get("nope")


def test_update_physical_writes_a_new_version(manager: Manager, coord) -> None:
    old = manager.submit(pipeline())
    new = reschedule(pipeline(split=4), old, ["h1", "h2"], first_port=100)
    assert manager.update_physical("wc", new) == new
    assert coord.get_physical("wc") == new and new.version == 2
    with pytest.raises(ManagerError, match="version 2, not above the current 2"):
        manager.update_physical("wc", new)
    with pytest.raises(ManagerError, match="keep its name and application ID"):
        manager.update_physical("wc", replace(new, app_id=new.app_id ^ 1, version=3))
    with pytest.raises(ManagerError, match="no running application named 'x'"):
        manager.update_physical("x", new)


def test_update_physical_refuses_foreign_ports_and_hosts(manager: Manager) -> None:
    old = manager.submit(pipeline())
    other = manager.submit(pipeline("other", split=1))
    stolen = other.workers[0]
    moved = [replace(w, host=stolen.host, port=stolen.port) if w.worker_id == 1 else w
             for w in old.workers]  # fmt: skip
    with pytest.raises(ManagerError, match="belongs to another application"):
        manager.update_physical("wc", replace(old, workers=moved, version=2))
    lost = [replace(w, host="h9") if w.worker_id == 1 else w for w in old.workers]
    with pytest.raises(ManagerError, match="unknown host 'h9'"):
        manager.update_physical("wc", replace(old, workers=lost, version=2))


def test_an_application_with_corrupt_state_can_still_be_killed(manager: Manager, coord) -> None:
    coord.put("physical/broken", [1, 2])
    coord.put("topology/broken", "not a topology")
    with pytest.raises(CoordinatorError, match="'physical/broken' holds malformed data"):
        manager.submit(pipeline())  # placement needs every application's ports
    assert manager.list() == ["broken"]
    manager.kill("broken")
    assert manager.list() == [] and coord.physical_names() == []
    manager.submit(pipeline())


def test_plans_of_two_applications_keep_each_others_reserved_ports_free(manager, coord) -> None:
    """Two updates planned before either is written (the autoscaler scaling two apps in one
    tick): the second must not take the port the first one plans to use."""
    manager.submit(pipeline("a", split=2))
    manager.submit(pipeline("b", split=2))
    for name in ("a", "b"):
        coord.put_app_state(name, {**coord.get_app_state(name), "active": True})
    first = manager.plan("a", Scale("split", 3))
    new_a = {(w.host, w.port) for w in first.physical.workers if w.worker_id in first.added}
    second = manager.plan(
        "b", Scale("split", 3), reserved={(w.host, w.port) for w in first.physical.workers}
    )
    new_b = {(w.host, w.port) for w in second.physical.workers if w.worker_id in second.added}
    assert new_a and new_b and not new_a & new_b
    unreserved = manager.plan("b", Scale("split", 3))
    clash = {
        (w.host, w.port) for w in unreserved.physical.workers if w.worker_id in unreserved.added
    }
    assert clash == new_a  # the race the reservation closes: the same free port for both
