"""The coordinator contract, run against every backend.

Each backend is one ``Store`` param: a URL that ``open_coordinator`` accepts
(also from another process) and a way to write raw bytes behind the API's
back.  ``sqlite`` uses a file in the test's temp dir; ``zookeeper`` a fresh
prefix on the session's ZooKeeper server (``tests/conftest.py``), so tests
never see each other's keys.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from typhoon.cluster import Cluster, FabricLink, HostInfo
from typhoon.coordinator import (
    AgentState,
    Coordinator,
    CoordinatorError,
    SqliteCoordinator,
    WorkerStatus,
    open_coordinator,
    parse_zk_url,
)
from typhoon.coordinator.zookeeper import KV, ZooKeeperCoordinator
from typhoon.manager import Manager, ManagerError
from typhoon.topology import app_id_for, load_topology_text, schedule

WORDCOUNT = """
name: wc
config: {batch_size: 10}
spouts:
  - id: source
    operator: sentence_source
    args: {count: 10, seed: 3}
bolts:
  - id: split
    operator: split_words
    parallelism: 2
  - id: count
    operator: count_by_key
    parallelism: 3
streams:
  - from: source
    to: split
    grouping: shuffle
  - from: split
    to: count
    grouping: {type: fields, fields: [word]}
"""


@dataclass
class Store:
    url: str
    corrupt: Callable[[str, bytes], None]  # store raw bytes under a key, bypassing JSON


def _sqlite_store(tmp_path: Path) -> Store:
    path = tmp_path / "coord.db"

    def corrupt(key: str, raw: bytes) -> None:
        with sqlite3.connect(path) as db:
            db.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, raw))

    return Store(f"sqlite://{path}", corrupt)


def _zookeeper_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    server = request.getfixturevalue("zookeeper_server")  # started on first use only
    prefix = f"/typhoon-test/{uuid.uuid4().hex}"
    auth = tmp_path / "zk-auth"  # the contract holds with ACLs on (typhoon/coordinator/zk_auth.py)
    auth.write_text("typhoon:contract-s3cret\n")
    auth.chmod(0o600)

    def corrupt(key: str, raw: bytes) -> None:
        zk = KazooClient(server.hosts, auth_data=[("digest", "typhoon:contract-s3cret")])
        zk.start(timeout=10)
        try:
            path = f"{prefix}/{KV}/{key}"
            if zk.exists(path):
                zk.set(path, raw)
            else:
                zk.create(path, raw, makepath=True)
        finally:
            zk.stop()
            zk.close()

    return Store(f"zk://{server.hosts}{prefix}?auth_file={auth}", corrupt)


@pytest.fixture(params=["sqlite", "zookeeper"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "zookeeper":
        return _zookeeper_store(request, tmp_path)
    return _sqlite_store(tmp_path)


@pytest.fixture
def coordinator(store: Store) -> Iterator[Coordinator]:
    c = open_coordinator(store.url)
    yield c
    c.close()


def wordcount(name: str = "wc"):
    topo = load_topology_text(WORDCOUNT.replace("name: wc", f"name: {name}"))
    return topo, schedule(topo, ["h1", "h2"], app_id=0x1234, first_port=100)


# ----- raw key-value store -----------------------------------------------------------------


def test_put_get_delete_list(coordinator: Coordinator) -> None:
    assert coordinator.get("a/b") is None
    value = {"x": [1, 2.5, "three", None, True], "nested": {"k": "v"}}
    coordinator.put("a/b", value)
    coordinator.put("a/b/c", 1)
    coordinator.put("a/bc", 2)
    coordinator.put("a-b", 3)
    assert coordinator.get("a/b") == value
    assert coordinator.list("a") == ["a/b", "a/b/c", "a/bc"]
    assert coordinator.list("a/b") == ["a/b/c"]
    assert coordinator.list() == ["a-b", "a/b", "a/b/c", "a/bc"]
    coordinator.delete("a/b")
    assert coordinator.list() == ["a-b", "a/bc"]
    coordinator.delete("missing/key")  # absent keys are fine


def test_create_only_if_absent(coordinator: Coordinator) -> None:
    assert coordinator.create("k", 1) is True
    assert coordinator.create("k", 2) is False
    assert coordinator.get("k") == 1


def test_change_log_order_and_contents(coordinator: Coordinator) -> None:
    v0 = coordinator.version()
    coordinator.put("a", 1)
    coordinator.put("b", 2)
    coordinator.put("a", 3)
    v1, keys = coordinator.changes_since(v0)
    assert keys == ["b", "a"]  # each key once, in the order of its latest change
    assert v1 == coordinator.version() > v0
    assert coordinator.changes_since(v1) == (v1, [])

    coordinator.put("dir/x", 1)
    coordinator.put("dir/y", 2)
    v2 = coordinator.version()
    coordinator.delete("dir")
    coordinator.delete("dir")  # nothing left: no change
    coordinator.create("a", 9)  # exists: no change
    v3, keys = coordinator.changes_since(v2)
    assert sorted(keys) == ["dir/x", "dir/y"]
    assert v3 > v2
    assert coordinator.changes_since(v0)[1] == ["b", "a", "dir/x", "dir/y"]


def test_versions_grow_with_every_write(coordinator: Coordinator) -> None:
    seen = [coordinator.version()]
    for i in range(5):
        coordinator.put("same", i)
        seen.append(coordinator.version())
    coordinator.delete("same")
    seen.append(coordinator.version())
    assert seen == sorted(set(seen))


def test_watch_calls_back_with_changed_keys(coordinator: Coordinator) -> None:
    coordinator.put("before", 1)  # older than the watch: not reported
    got: queue.Queue[list[str]] = queue.Queue()
    watch = coordinator.watch(got.put, interval=0.01)
    try:
        coordinator.put("physical/x", 1)
        coordinator.delete("before")
        seen: list[str] = []
        deadline = time.monotonic() + 5
        while set(seen) != {"physical/x", "before"} and time.monotonic() < deadline:
            seen += got.get(timeout=5)
        assert seen == ["physical/x", "before"]
    finally:
        watch.stop()
    coordinator.put("after", 1)
    time.sleep(0.1)
    assert got.empty()


def test_watch_survives_a_failing_callback(coordinator: Coordinator) -> None:
    calls: list[list[str]] = []

    def callback(keys: list[str]) -> None:
        calls.append(keys)
        raise RuntimeError("boom")

    with coordinator.watch(callback, interval=0.01):
        coordinator.put("one", 1)
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        coordinator.put("two", 2)
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert calls == [["one"], ["two"]]


# ----- typed Table-1 API -------------------------------------------------------------------


def test_topology_round_trips(coordinator: Coordinator) -> None:
    topo, physical = wordcount()
    assert coordinator.get_topology("wc") is None and coordinator.get_physical("wc") is None
    coordinator.put_topology(topo)
    coordinator.put_physical(physical)
    assert coordinator.get_topology("wc") == topo
    assert coordinator.get_physical("wc") == physical
    coordinator.put_topology(wordcount("other")[0])
    assert coordinator.topology_names() == ["other", "wc"]
    assert coordinator.physical_names() == ["wc"]


def test_cluster_and_agents_round_trip(coordinator: Coordinator) -> None:
    assert coordinator.get_cluster() is None
    cluster = Cluster(
        {"h1": HostInfo("h1", "br1", 1), "h2": HostInfo("h2", "br2", 2, first_worker_port=200)},
        [FabricLink("h1", 1, "h2", 1)],
    )
    coordinator.put_cluster(cluster)
    assert coordinator.get_cluster() == cluster

    a1 = AgentState("h1", 123, 1000.5, (100, 65279), [100, 101], {"wc": [1, 2]})
    a2 = AgentState("h2", 456, 1001.0, (200, 65279))
    coordinator.put_agent(a1)
    coordinator.put_agent(a2)
    assert coordinator.agents() == {"h1": a1, "h2": a2}
    assert coordinator.get_agent("h1") == a1
    assert a1.free_ports() == 65279 - 100 + 1 - 2
    coordinator.delete_agent("h1")
    assert list(coordinator.agents()) == ["h2"]


def test_statuses_metrics_and_state_round_trip(coordinator: Coordinator) -> None:
    s1 = WorkerStatus(1, "h1", "starting", pid=10, port=100, tap="ty12340001", updated=5.0)
    s12 = WorkerStatus(12, "h2", "exited", pid=11, port=101, exit_code=-9, error="killed")
    for s in (s12, s1):
        coordinator.put_worker_status("wc", s)
    assert coordinator.worker_statuses("wc") == {1: s1, 12: s12}
    assert list(coordinator.worker_statuses("wc")) == [1, 12]
    assert coordinator.worker_statuses("nothing") == {}
    coordinator.delete_worker_status("wc", 12)
    assert coordinator.worker_statuses("wc") == {1: s1}

    coordinator.put_metrics("wc", 2, {"tuples_in": 5, "per_stream": {"1": 3}})
    coordinator.put_metrics("wc", 10, {"tuples_in": 7})
    assert coordinator.get_metrics("wc") == {
        2: {"tuples_in": 5, "per_stream": {"1": 3}},
        10: {"tuples_in": 7},
    }
    assert coordinator.get_app_state("wc") == {}
    coordinator.put_app_state("wc", {"active": True})
    assert coordinator.get_app_state("wc") == {"active": True}


def test_worker_status_refuses_unknown_state() -> None:
    with pytest.raises(ValueError, match="worker state"):
        WorkerStatus(1, "h1", "flying")


def test_delete_application_removes_everything_of_that_app_only(
    coordinator: Coordinator,
) -> None:
    for name in ("wc", "wc2", "wc-b"):
        topo, physical = wordcount(name)
        coordinator.put_topology(topo)
        coordinator.put_physical(physical)
        coordinator.put_app_state(name, {"active": True})
        for w in physical.workers:
            coordinator.put_worker_status(name, WorkerStatus(w.worker_id, w.host, "attached"))
            coordinator.put_metrics(name, w.worker_id, {"n": 1})
    v = coordinator.version()
    coordinator.delete_application("wc")
    for prefix in ("topology/wc", "physical/wc", "state/wc", "status/wc", "metrics/wc"):
        assert coordinator.get(prefix) is None
        assert coordinator.list(prefix) == []
    assert coordinator.topology_names() == ["wc-b", "wc2"]
    assert len(coordinator.worker_statuses("wc2")) == 6
    assert len(coordinator.get_metrics("wc-b")) == 6
    _, keys = coordinator.changes_since(v)
    assert keys[0] == "physical/wc"  # readers see the deployment go first
    assert len(keys) == 3 + 2 * 6


# ----- bad data ----------------------------------------------------------------------------


def test_corrupt_value_gives_a_clear_error(coordinator: Coordinator, store: Store) -> None:
    store.corrupt("topology/bad", b"\x00{not json")
    with pytest.raises(CoordinatorError, match=r"'topology/bad'.*not JSON"):
        coordinator.get("topology/bad")
    with pytest.raises(CoordinatorError, match="not JSON"):
        coordinator.get_topology("bad")


@pytest.mark.parametrize(
    ("key", "value", "read"),
    [
        ("topology/x", {"nodes": 3}, lambda c: c.get_topology("x")),
        ("physical/x", [1, 2], lambda c: c.get_physical("x")),
        ("cluster", "h1", lambda c: c.get_cluster()),
        ("agents/h1", {"host": "h1"}, lambda c: c.agents()),
        (
            "status/x/1",
            {"worker_id": 1, "host": "h", "state": "?"},
            lambda c: c.worker_statuses("x"),
        ),
        ("metrics/x/notanid", {}, lambda c: c.get_metrics("x")),
        ("state/x", [True], lambda c: c.get_app_state("x")),
    ],
)
def test_malformed_value_names_its_key(
    coordinator: Coordinator, key: str, value: object, read: Callable[[Coordinator], object]
) -> None:
    coordinator.put(key, value)
    with pytest.raises(CoordinatorError, match=key):
        read(coordinator)


@pytest.mark.parametrize("value", [object(), float("nan"), {1: {2, 3}}])
def test_unserializable_value_is_refused(coordinator: Coordinator, value: object) -> None:
    with pytest.raises(CoordinatorError, match="not JSON-serializable"):
        coordinator.put("k", value)
    assert coordinator.get("k") is None


@pytest.mark.parametrize("key", ["", "/a", "a/", "a//b", "a/../b", "a b", "a/./b", "ä"])
def test_invalid_keys_are_refused(coordinator: Coordinator, key: str) -> None:
    with pytest.raises(CoordinatorError, match="invalid coordinator key"):
        coordinator.put(key, 1)


# ----- several processes -------------------------------------------------------------------


def _writer(url: str, tag: str, n: int, contested: int, wins: multiprocessing.Queue) -> None:
    c = open_coordinator(url)
    won = []
    for i in range(n):
        c.put(f"race/{tag}/{i}", {"i": i})
        if i < contested and c.create(f"claim/{i}", tag):
            won.append(i)
    wins.put((tag, won))
    c.close()


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_concurrent_writers_lose_no_update(
    coordinator: Coordinator, store: Store, method: str
) -> None:
    ctx = multiprocessing.get_context(method)
    wins = ctx.Queue()
    v0 = coordinator.version()
    n, contested = 150, 50
    procs = [ctx.Process(target=_writer, args=(store.url, tag, n, contested, wins)) for tag in "ab"]
    for p in procs:
        p.start()
    results = dict(wins.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for tag in "ab":
        assert coordinator.list(f"race/{tag}") == sorted(f"race/{tag}/{i}" for i in range(n))
    assert sorted(results["a"] + results["b"]) == list(range(contested))  # one winner per key
    for i in results["a"]:
        assert coordinator.get(f"claim/{i}") == "a"
    version, keys = coordinator.changes_since(v0)
    assert len(keys) == 2 * n + contested and version == coordinator.version()


def test_connection_survives_fork(coordinator: Coordinator) -> None:
    """A coordinator opened before fork works in the child (it opens its own connection)."""
    coordinator.put("parent", 1)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=coordinator.put, args=("child", 2))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert coordinator.get("child") == 2
    coordinator.put("parent", 3)
    assert coordinator.get("parent") == 3


def test_threads_share_one_coordinator(coordinator: Coordinator) -> None:
    import threading

    def write(t: int) -> None:
        for i in range(50):
            coordinator.put(f"t{t}/{i}", i)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(len(coordinator.list(f"t{t}")) for t in range(4)) == 200


# ----- backend selection -------------------------------------------------------------------


def test_open_coordinator_picks_the_backend(tmp_path: Path, monkeypatch) -> None:
    for url in (str(tmp_path / "a.db"), f"sqlite://{tmp_path}/b.db"):
        c = open_coordinator(url)
        assert isinstance(c, SqliteCoordinator)
        c.close()
    monkeypatch.setenv("TYPHOON_COORDINATOR", f"sqlite://{tmp_path}/env/c.db")
    c = open_coordinator()
    assert c.path == tmp_path / "env" / "c.db"  # type: ignore[attr-defined]
    c.close()
    c = SqliteCoordinator()
    assert c.path == tmp_path / "env" / "c.db"
    c.close()
    with pytest.raises(CoordinatorError, match="unknown coordinator URL"):
        open_coordinator("redis://localhost")


def test_zookeeper_url() -> None:
    assert parse_zk_url("zk://h1:2181,h2:2181/apps/ty/") == ("h1:2181,h2:2181", "/apps/ty")
    assert parse_zk_url("zk://h1:2181") == ("h1:2181", "/typhoon")
    with pytest.raises(CoordinatorError, match="no ZooKeeper host"):
        parse_zk_url("zk:///x")


def test_unreadable_database_gives_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-db"
    bad.write_bytes(b"this is not an sqlite file" * 100)
    with pytest.raises(CoordinatorError, match="cannot open coordinator database"):
        SqliteCoordinator(bad)


def test_open_coordinator_picks_zookeeper(zookeeper_server) -> None:
    c = open_coordinator(f"zk://{zookeeper_server.hosts}/typhoon-test/url")
    try:
        assert isinstance(c, ZooKeeperCoordinator)
        assert (c.hosts, c.prefix) == (zookeeper_server.hosts, "/typhoon-test/url")
    finally:
        c.close()


# ----- application IDs are claimed atomically (issue 28) -------------------------------------


def colliding_names() -> tuple[str, str]:
    """Two topology names with the same 16-bit application ID (found by counting)."""
    seen: dict[int, str] = {}
    for i in itertools.count():
        name = f"race-{i}"
        other = seen.setdefault(app_id_for(name), name)
        if other != name:
            return other, name
    raise AssertionError("unreachable")


def test_an_app_id_is_claimed_once(coordinator: Coordinator) -> None:
    assert coordinator.claim_app_id(0x42, "a") is None
    assert coordinator.claim_app_id(0x42, "a") is None  # its own claim again
    assert coordinator.claim_app_id(0x42, "b") == "a"
    coordinator.delete_application("a")
    assert coordinator.claim_app_id(0x42, "b") is None


class _MeetAtCreate:
    """A coordinator whose submissions wait for each other where each claims its name."""

    def __init__(self, inner: Coordinator, barrier: threading.Barrier) -> None:
        self._inner, self._barrier = inner, barrier

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def create(self, key: str, value: object) -> bool:
        if key.startswith("topology/"):
            try:
                self._barrier.wait()  # both have passed every check before this point
            except threading.BrokenBarrierError:
                pass
        return self._inner.create(key, value)


def test_two_submissions_with_one_app_id_cannot_both_pass(store: Store) -> None:
    first, second = colliding_names()
    with open_coordinator(store.url) as c:
        c.put_cluster(
            Cluster({h: HostInfo(h, f"br{h}", i + 1) for i, h in enumerate(["h1", "h2"])})
        )
    barrier = threading.Barrier(2, timeout=10)
    outcome: dict[str, object] = {}

    def submit(name: str) -> None:
        with open_coordinator(store.url) as c:
            topo = load_topology_text(WORDCOUNT.replace("name: wc", f"name: {name}"))
            try:
                outcome[name] = Manager(_MeetAtCreate(c, barrier)).submit(topo)  # type: ignore[arg-type]
            except ManagerError as e:
                outcome[name] = e

    threads = [threading.Thread(target=submit, args=(n,)) for n in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    errors = [v for v in outcome.values() if isinstance(v, ManagerError)]
    assert len(outcome) == 2 and len(errors) == 1, outcome
    [winner] = [n for n, v in outcome.items() if not isinstance(v, ManagerError)]
    loser = second if winner == first else first
    assert str(errors[0]) == (
        f"application ID {app_id_for(first):#06x} of '{loser}' is already used by '{winner}'; "
        "rename the topology"
    )
    with open_coordinator(store.url) as c:
        assert c.physical_names() == [winner] and c.topology_names() == [winner]
        Manager(c).kill(winner)
        assert Manager(c).submit(
            load_topology_text(WORDCOUNT.replace("name: wc", f"name: {loser}"))
        ).app_id == app_id_for(first)
