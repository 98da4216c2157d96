"""What only the ZooKeeper backend has: a bounded change log, pushed watches, outages.

The backend contract itself runs in ``test_coordinator_contract.py``.
"""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Iterator

import pytest
from zkserver import ZooKeeperServer, free_port  # tests/: on sys.path for tests/conftest.py

from typhoon.coordinator import CoordinatorError
from typhoon.coordinator.zookeeper import CHANGES, ZooKeeperCoordinator


def _prefix() -> str:
    return f"/typhoon-test/{uuid.uuid4().hex}"


@pytest.fixture
def small_log(zookeeper_server: ZooKeeperServer) -> Iterator[ZooKeeperCoordinator]:
    """A coordinator whose log keeps 10 entries, trimmed every 5."""
    c = ZooKeeperCoordinator(zookeeper_server.hosts, _prefix(), log_size=10, trim_every=5)
    yield c
    c.close()


def _log_entries(c: ZooKeeperCoordinator) -> int:
    zk = c._zk()
    (gen,) = zk.get_children(f"{c.prefix}/{CHANGES}")
    return len(zk.get_children(f"{c.prefix}/{CHANGES}/{gen}"))


def test_log_is_trimmed_and_stays_exact_for_recent_readers(
    small_log: ZooKeeperCoordinator,
) -> None:
    c = small_log
    for i in range(60):
        c.put(f"k/{i % 7}", i)
        assert _log_entries(c) <= 10 + 5
    v = c.version()
    c.put("k/3", "x")
    c.put("new", 1)
    c.delete("k/5")
    assert c.changes_since(v) == (c.version(), ["k/3", "new", "k/5"])


def test_reader_behind_the_log_is_told_to_resync(small_log: ZooKeeperCoordinator) -> None:
    c = small_log
    c.put("gone", 1)
    old = c.version()
    c.delete("gone")  # deleted long ago: only the trimmed log knew
    for i in range(30):
        c.put(f"k/{i}", i)
    c.delete("k/29")  # deleted recently: still in the log
    version, keys = c.changes_since(old)
    assert version == c.version()
    current = c.list()
    assert set(keys) == set(current) | {"k/29"}
    assert keys[-1] == "k/29" and keys[-2] == "k/28"  # the logged part keeps its order
    assert set(c.changes_since(0)[1]) >= set(current)  # a fresh reader: every key


def test_log_rolls_over_with_growing_versions(zookeeper_server: ZooKeeperServer) -> None:
    with ZooKeeperCoordinator(
        zookeeper_server.hosts, _prefix(), log_size=10, trim_every=5, rollover=25
    ) as c:
        seen = [c.version()]
        old = seen[0]
        for i in range(80):
            c.put(f"k/{i % 9}", i)
            seen.append(c.version())
        assert seen == sorted(set(seen))
        (gen,) = c._zk().get_children(f"{c.prefix}/{CHANGES}")
        assert int(gen[1:]) >= 2
        v = c.version()
        c.put("after", 1)
        assert c.changes_since(v) == (c.version(), ["after"])
        assert set(c.changes_since(old)[1]) == set(c.list())  # an older generation: resync


def test_watch_is_pushed_not_polled(zookeeper_server: ZooKeeperServer) -> None:
    with ZooKeeperCoordinator(zookeeper_server.hosts, _prefix()) as c:
        got: queue.Queue[list[str]] = queue.Queue()
        with c.watch(got.put, interval=60):  # a poll would take a minute
            # its first report comes from a read that also armed the ZooKeeper watch
            # (not a sleep "until it is armed"); the next change can only be pushed
            c.put("physical/w", 0)
            assert got.get(timeout=30) == ["physical/w"]
            c.put("physical/x", 1)
            assert got.get(timeout=30) == ["physical/x"]  # well before the 60 s poll


def test_keys_and_directories(zookeeper_server: ZooKeeperServer) -> None:
    """A znode that only holds children is not a key until it gets a value."""
    with ZooKeeperCoordinator(zookeeper_server.hosts, _prefix()) as c:
        c.put("a/b/c", 1)
        assert c.get("a/b") is None and c.list() == ["a/b/c"]
        assert c.create("a/b", 2) is True
        assert c.create("a/b", 3) is False
        assert c.list("a") == ["a/b", "a/b/c"]
        v = c.version()
        c.delete("a")
        assert c.changes_since(v)[1] == ["a/b", "a/b/c"]
        assert c.list() == []


def test_too_large_value_is_refused(zookeeper_server: ZooKeeperServer) -> None:
    with ZooKeeperCoordinator(zookeeper_server.hosts, _prefix()) as c:
        with pytest.raises(CoordinatorError, match="at most"):
            c.put("big", "x" * 2_000_000)
        c.put("small", 1)  # the session is still fine


def test_unreachable_server_is_a_clear_error() -> None:
    hosts = f"127.0.0.1:{free_port()}"  # nobody listens there
    t0 = time.monotonic()
    with pytest.raises(CoordinatorError, match=f"cannot reach ZooKeeper at {hosts}"):
        ZooKeeperCoordinator(hosts, _prefix(), timeout=1.0)
    assert time.monotonic() - t0 < 5


def test_lost_connection_is_a_clear_error_and_heals(
    private_zookeeper: ZooKeeperServer,
) -> None:
    server = private_zookeeper
    c = ZooKeeperCoordinator(server.hosts, "/typhoon", timeout=1.0)
    try:
        c.put("k", 1)
        server.stop()
        t0 = time.monotonic()
        with pytest.raises(CoordinatorError, match=f"ZooKeeper at {server.hosts}") as put:
            c.put("k", 2)
        with pytest.raises(CoordinatorError, match="ZooKeeper") as get:
            c.get("k")
        assert "connection lost" in str(put.value) and "connection lost" in str(get.value)
        assert time.monotonic() - t0 < 10
        server.restart()
        deadline = time.monotonic() + 15
        while True:  # the client reconnects by itself (a new session if it expired)
            try:
                c.put("k", 3)
                break
            except CoordinatorError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert c.get("k") == 3
    finally:
        c.close()
    with pytest.raises(CoordinatorError, match="closed"):
        c.get("k")


# ----- digest authentication and creator-only ACLs (issue 28) --------------------------------


def _credentials(tmp_path, text: str = "typhoon:s3cret") -> str:
    path = tmp_path / f"zk-auth-{uuid.uuid4().hex[:6]}"
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


def test_without_the_credentials_physical_keys_are_refused(zookeeper_server, tmp_path) -> None:
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError

    from typhoon.coordinator import open_coordinator

    parent = _prefix()  # not the store's: it stays open to others
    prefix = f"{parent}/ty"
    url = f"zk://{zookeeper_server.hosts}{prefix}"
    with open_coordinator(f"{url}?auth_file={_credentials(tmp_path)}") as c:
        c.put("physical/wc", {"workers": []})
        assert c.get("physical/wc") == {"workers": []}
    stranger = KazooClient(zookeeper_server.hosts)  # no credentials: the world
    stranger.start(timeout=10)
    try:
        node = f"{prefix}/kv/physical/wc"
        with pytest.raises(NoAuthError):
            stranger.get(node)
        with pytest.raises(NoAuthError):
            stranger.set(node, b'{"workers": [{"operator": "evil:Op"}]}')
        with pytest.raises(NoAuthError):
            stranger.create(f"{prefix}/kv/physical/evil", b"{}")
        with pytest.raises(NoAuthError):
            stranger.delete(node)
        with pytest.raises(NoAuthError):
            stranger.get_children(f"{prefix}/kv/physical")
        stranger.create(f"{parent}/someone-else", b"")  # the parent is not ours to close
    finally:
        stranger.stop()
        stranger.close()
    with pytest.raises(CoordinatorError, match=r"refused access .*add \?auth_file=FILE"):
        open_coordinator(url)
    wrong = _credentials(tmp_path, "typhoon:not-it")
    with pytest.raises(CoordinatorError, match="credentials are not the ones"):
        open_coordinator(f"{url}?auth_file={wrong}")


def test_an_open_store_is_secured_once_credentials_are_configured(
    zookeeper_server, tmp_path
) -> None:
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError

    from typhoon.coordinator import open_coordinator

    prefix = _prefix()
    url = f"zk://{zookeeper_server.hosts}{prefix}"
    with open_coordinator(url) as c:  # made before ACLs were turned on
        c.put("physical/wc", 1)
    with open_coordinator(f"{url}?auth_file={_credentials(tmp_path)}") as c:
        assert c.get("physical/wc") == 1
        c.put("physical/two", 2)
    stranger = KazooClient(zookeeper_server.hosts)
    stranger.start(timeout=10)
    try:
        for key in ("physical/wc", "physical/two"):
            with pytest.raises(NoAuthError):
                stranger.get(f"{prefix}/kv/{key}")
    finally:
        stranger.stop()
        stranger.close()
