"""Secret files are 0600 (directories 0700) from their first byte, whatever the umask.

typhoon/private_files.py, and every place that writes a token, a session key,
a worker spec or a checkpoint: the controller's generated ``ryu.conf``, the
emulation's ``client.ini`` and controller config, the debug worker's spec,
worker specs, the local checkpoint store.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller import daemon
from mininet_env.processes import write_controller_config
from mininet_env.run import EmulatedCluster
from typhoon.checkpoint import CheckpointStore
from typhoon.debug.spec import DebugSpec
from typhoon.private_files import private_dir, write_private
from typhoon.runtime.spec import WorkerSpec
from typhoon.topology import load_topology_text, schedule


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(params=[0o022, 0o000], ids=["umask022", "umask000"])
def umask(request) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def loose(path: Path, text: str = "old") -> Path:
    """An older file at ``path``, readable by everyone."""
    path.write_text(text)
    path.chmod(0o644)
    return path


def test_write_private_replaces_a_loose_file_and_a_symlink(tmp_path, umask):
    f = loose(tmp_path / "secret")
    write_private(f, "token = x\n")
    assert f.read_text() == "token = x\n" and mode(f) == 0o600
    elsewhere = loose(tmp_path / "elsewhere", "do not overwrite")
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    write_private(link, b"key")
    assert not link.is_symlink() and link.read_bytes() == b"key" and mode(link) == 0o600
    assert elsewhere.read_text() == "do not overwrite"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "link", "secret"]


def test_private_dir_makes_parents_0700_and_tightens_a_loose_one(tmp_path, umask):
    d = private_dir(tmp_path / "a" / "b" / "c")
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", d)] == [0o700] * 3
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    wide.chmod(0o777)
    assert mode(private_dir(wide)) == 0o700
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        private_dir(tmp_path / "file")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own a directory as another user")
def test_private_dir_refuses_another_users_open_directory(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(PermissionError, match="mode 0755, owned by uid 65534"):
        private_dir(theirs)
    theirs.chmod(0o700)  # as NFS makes root's directories under root_squash: usable
    assert private_dir(theirs) == theirs


def test_the_controllers_ryu_conf_is_0600_even_over_an_old_file(tmp_path, umask, monkeypatch):
    from controller.framework import launcher

    conf = loose(tmp_path / "ryu.conf")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    seen = {}

    def fake_manager(argv, prog):  # what ryu-manager would read, at the moment it starts
        seen["text"], seen["mode"] = conf.read_text(), mode(conf)
        return 0

    monkeypatch.setattr(launcher, "main", fake_manager)
    argv = ["--runtime-dir", str(tmp_path), "--coordinator", str(tmp_path / "c.db"),
            "--api-token-file", str(token)]  # fmt: skip
    assert daemon.main(argv) == 0
    assert "api_token = s3cret" in seen["text"] and seen["mode"] == 0o600


def test_the_emulations_client_ini_and_controller_config_are_0600(tmp_path, umask):
    config = write_controller_config(tmp_path / "controller.conf", "c.db", "api_token = t\n")
    assert mode(config) == 0o600
    loose(tmp_path / "client.ini")
    cluster = EmulatedCluster.__new__(EmulatedCluster)  # only what write_client_config reads
    cluster.workdir, cluster.rest_url, cluster.token = tmp_path, "http://127.0.0.1:1/typhoon", "t"
    ini = cluster.write_client_config()
    assert "token = t" in ini.read_text() and mode(ini) == 0o600


def test_debug_and_worker_specs_are_0600(tmp_path, umask):
    spec = DebugSpec("s1", "wc", 7, 2, "out", "h1", 9, "tdbgs1", "http://c/debug", "key")
    spec.save(loose(tmp_path / "s1.spec.json"))
    assert DebugSpec.load(tmp_path / "s1.spec.json").key == "key"
    assert mode(tmp_path / "s1.spec.json") == 0o600
    topo = load_topology_text(
        "name: t\nspouts: [{id: s, operator: sequence_source}]\n"
        "bolts: [{id: k, operator: sequence_check}]\n"
        "streams: [{from: s, to: k, grouping: shuffle}]\n"
    )
    physical = schedule(topo, ["h1"], app_id=5)
    WorkerSpec(topo, physical, 1).save(tmp_path / "w1.json")
    assert mode(tmp_path / "w1.json") == 0o600


def test_local_checkpoints_are_0700_directories_of_0600_files(tmp_path, umask):
    root = tmp_path / "var-tmp" / "typhoon" / "checkpoints"
    store = CheckpointStore.local(str(root), "app")
    store.write(1, "w1", b"state")
    epoch = root / "app" / f"{1:012d}"
    dirs = [tmp_path / "var-tmp", tmp_path / "var-tmp" / "typhoon", root, root / "app", epoch]
    assert [mode(d) for d in dirs] == [0o700] * 5
    assert mode(epoch / "w1.ckpt") == 0o600 and store.read(1, "w1") == b"state"
    store.mark_complete(1, {"parts": ["w1"]})
    assert all(mode(p) == 0o600 for p in epoch.iterdir())
