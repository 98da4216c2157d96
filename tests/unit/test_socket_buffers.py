"""SocketBuffers: rmem_default raised while emulations run, restored after the last one."""

from __future__ import annotations

import subprocess

import pytest

from mininet_env.network import SocketBuffers


@pytest.fixture
def buffers(tmp_path, monkeypatch):
    sysctl = tmp_path / "rmem_default"
    sysctl.write_text("212992\n")
    monkeypatch.setattr(SocketBuffers, "SYSCTL", sysctl)
    monkeypatch.setattr(SocketBuffers, "RECORD", tmp_path / "record.json")
    monkeypatch.setattr(SocketBuffers, "LOCK", tmp_path / "record.lock")
    return sysctl


def value(path) -> int:
    return int(path.read_text())


def test_raised_while_held_and_restored_by_the_last_release(buffers):
    SocketBuffers.acquire(4 << 20)
    SocketBuffers.acquire(1 << 20)  # a second emulation that needs less
    assert value(buffers) == 4 << 20
    SocketBuffers.release()
    assert value(buffers) == 4 << 20
    SocketBuffers.release()
    assert value(buffers) == 212992
    assert not SocketBuffers.RECORD.exists()


def test_a_larger_value_already_set_is_left_alone(buffers):
    buffers.write_text(str(8 << 20))
    SocketBuffers.acquire(4 << 20)
    SocketBuffers.release()
    assert value(buffers) == 8 << 20


def test_a_value_someone_else_changed_meanwhile_is_not_overwritten(buffers):
    SocketBuffers.acquire(4 << 20)
    buffers.write_text(str(1 << 22 | 1))
    SocketBuffers.release()
    assert value(buffers) == 1 << 22 | 1


def test_a_holder_that_died_does_not_keep_the_raise(buffers):
    dead = subprocess.Popen(["true"])
    dead.wait()
    SocketBuffers.RECORD.write_text(
        f'{{"saved": 212992, "ours": {4 << 20}, "holders": [{dead.pid}]}}'
    )
    buffers.write_text(str(4 << 20))
    SocketBuffers.acquire(4 << 20)  # the dead holder is dropped; its saved value kept
    SocketBuffers.release()
    assert value(buffers) == 212992


def test_the_plan_tells_the_controller_what_each_port_holds():
    from mininet_env.fabric import EMULATED_SOCKET_BUFFER, FabricPlan

    cluster = FabricPlan(hosts=2).cluster()
    assert {h.socket_buffer for h in cluster.hosts.values()} == {EMULATED_SOCKET_BUFFER}
    assert FabricPlan(hosts=2, socket_buffer=1 << 20).cluster().hosts["h2"].socket_buffer == (
        1 << 20
    )
    with pytest.raises(ValueError, match="socket buffer"):
        FabricPlan(hosts=2, socket_buffer=4096)
