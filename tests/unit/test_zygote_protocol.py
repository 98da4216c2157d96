"""The launcher <-> worker fork server messages (typhoon.zygote_protocol): what a
fork request must look like, every way one can be wrong, and the replies."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from typhoon.supervised import command_line
from typhoon.zygote import ForkJob, fork_job, worker_specs
from typhoon.zygote_protocol import (
    MAX_MESSAGE,
    MAX_SPECS,
    MAX_URL,
    ForkRequest,
    ZygoteProtocolError,
    encode,
    fork_request,
    reply,
)

SPEC = "/tmp/run/worker-3.spec.json"


def msg(**fields: object) -> bytes:
    return json.dumps({"op": "fork", "id": 4, "specs": [SPEC], **fields}).encode()


def test_a_fork_request_names_its_specs_and_carries_one_descriptor() -> None:
    assert fork_request(msg(), 1) == ForkRequest(4, (SPEC,))
    chain = [SPEC, "/tmp/run/worker-4.spec.json"]
    assert fork_request(msg(specs=chain), 1).specs == tuple(chain)


@pytest.mark.parametrize(
    ("data", "fds", "why"),
    [
        (b"\xff\xfe", 1, "not JSON"),
        (b"{", 1, "not JSON"),
        (b"[1, 2]", 1, "JSON object"),
        (msg(op="exec"), 1, "unknown op"),
        (msg(id=-1), 1, "id must be"),
        (msg(id=True), 1, "id must be"),
        (msg(id="4"), 1, "id must be"),
        (msg(), 0, "one log descriptor, not 0"),
        (msg(), 2, "one log descriptor, not 2"),
        (msg(specs=[]), 1, "specs must be"),
        (msg(specs=SPEC), 1, "specs must be"),
        (msg(specs=[SPEC] * (MAX_SPECS + 1)), 1, "specs must be"),
        (msg(specs=["worker-3.spec.json"]), 1, "absolute"),
        (msg(specs=["/etc/passwd"]), 1, "absolute"),
        (msg(specs=[3]), 1, "absolute"),
        (msg(specs=["/tmp/a\0b.spec.json"]), 1, "NUL"),
        (msg(argv=["/bin/sh", "-c", "true"]), 1, "unknown fields"),
        (msg(env={"LD_PRELOAD": "/x.so"}), 1, "unknown fields"),
    ],
)
def test_a_bad_request_is_refused_with_its_reason(data: bytes, fds: int, why: str) -> None:
    with pytest.raises(ZygoteProtocolError, match=why):
        fork_request(data, fds)


def test_a_truncated_request_is_refused_whatever_it_holds() -> None:
    with pytest.raises(ZygoteProtocolError, match="truncated"):
        fork_request(msg(), 1, truncated=True)


def test_encode_refuses_a_message_over_the_limit() -> None:
    with pytest.raises(ZygoteProtocolError, match="over"):
        encode({"op": "fork", "specs": ["x" * MAX_MESSAGE]})


def test_replies_are_checked() -> None:
    assert reply(b'{"op":"ready","pid":9}').pid == 9
    forked = reply(b'{"op":"forked","id":2,"pid":10}')
    assert (forked.op, forked.request_id, forked.pid) == ("forked", 2, 10)
    assert reply(b'{"op":"refused","id":2,"error":"no"}').error == "no"
    assert reply(b'{"op":"exit","pid":10,"code":-9}').code == -9
    for bad in (b'{"op":"exit","pid":10}', b'{"op":"forked","id":"2","pid":10}', b'{"op":"x"}'):
        with pytest.raises(ZygoteProtocolError):
            reply(bad)


def test_only_a_worker_command_line_is_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.executable", "/venv/bin/python")
    worker = ["/venv/bin/python", "-m", "typhoon.runtime.worker"]
    assert worker_specs([*worker, SPEC]) == [SPEC]
    assert worker_specs(worker) is None  # no spec
    assert worker_specs(["/venv/bin/python", "-m", "pyspark_bridge.driver", SPEC]) is None
    assert worker_specs(["/other/python", "-m", "typhoon.runtime.worker", SPEC]) is None


def test_a_retitled_command_line_reads_as_a_spawned_one() -> None:
    argv = ["/venv/bin/python", "-m", "typhoon.runtime.worker", SPEC]
    assert command_line([" ".join(argv), "", "", ""]) == argv
    assert command_line(argv) == argv
    assert command_line([]) == []


def test_the_zygote_preloads_only_built_in_operators_and_never_eventlet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typhoon.runtime.zygote_server import preload

    monkeypatch.delitem(sys.modules, "eventlet", raising=False)  # other tests' imports
    with pytest.raises(ValueError, match="unknown built-in operator"):
        preload(["os:system"], checkpoints=False)
    preload(["split_words"], checkpoints=False)
    with pytest.raises(ValueError, match="unknown transport"):
        preload([], checkpoints=False, transport="udp")
    preload([], checkpoints=False, transport="sdn")  # an agent's zygote
    assert "typhoon.runtime.sdn" in sys.modules
    monkeypatch.setitem(sys.modules, "eventlet", object())
    with pytest.raises(RuntimeError, match="eventlet"):
        preload([], checkpoints=False)


DEBUG_SPEC = "/tmp/run/debug/ab12cd.spec.json"


def test_a_debug_request_names_one_spec_and_maybe_a_coordinator() -> None:
    got = fork_request(msg(program="debug", specs=[DEBUG_SPEC], coordinator="zk://h:2181/t"), 1)
    assert got == ForkRequest(4, (DEBUG_SPEC,), "debug", "zk://h:2181/t")
    assert fork_request(msg(program="debug", specs=[DEBUG_SPEC]), 1).coordinator is None
    assert fork_request(msg(program="worker"), 1) == ForkRequest(4, (SPEC,))


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"program": "shell"}, "unknown program"),
        ({"program": 1}, "unknown program"),
        ({"program": "debug", "specs": [DEBUG_SPEC, DEBUG_SPEC]}, "one spec"),
        ({"program": "debug", "coordinator": ""}, "coordinator must be"),
        ({"program": "debug", "coordinator": 5}, "coordinator must be"),
        ({"program": "debug", "coordinator": "a\0b"}, "coordinator must be"),
        ({"program": "debug", "coordinator": "x" * (MAX_URL + 1)}, "coordinator must be"),
        ({"coordinator": "zk://h:2181"}, "unknown fields"),  # a topology worker takes none
        ({"program": "debug", "argv": ["-c"]}, "unknown fields"),
        ({"program": "debug", "specs": ["/etc/passwd"]}, "absolute"),
    ],
)
def test_a_bad_debug_request_is_refused_with_its_reason(
    fields: dict[str, object], why: str
) -> None:
    with pytest.raises(ZygoteProtocolError, match=why):
        fork_request(msg(**fields), 1)


def test_a_debug_worker_command_line_is_forked_as_the_debug_program(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("sys.executable", "/venv/bin/python")
    monkeypatch.chdir(tmp_path)
    debug = ["/venv/bin/python", "-m", "typhoon.debug.worker"]
    worker = ["/venv/bin/python", "-m", "typhoon.runtime.worker"]
    assert fork_job([*worker, SPEC]) == ForkJob("worker", [SPEC])
    assert fork_job([*debug, DEBUG_SPEC]) == ForkJob("debug", [DEBUG_SPEC])
    assert fork_job([*debug, "s.spec.json", "--coordinator", "zk://h"]) == ForkJob(
        "debug", [f"{tmp_path}/s.spec.json"], "zk://h"
    )
    for other in ([*debug], [*debug, DEBUG_SPEC, "--coordinator"], [*debug, "a", "--x", "b"]):
        assert fork_job(other) is None
    assert fork_job(["/venv/bin/python", "-m", "pyspark_bridge.driver", SPEC]) is None


def test_a_program_is_loaded_only_while_eventlet_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from typhoon.runtime.zygote_server import load_program

    monkeypatch.delitem(sys.modules, "eventlet", raising=False)  # other tests' imports
    load_program("debug")
    assert "typhoon.debug.worker" in sys.modules
    monkeypatch.setitem(sys.modules, "eventlet", object())
    for program in ("worker", "debug"):
        with pytest.raises(RuntimeError, match="eventlet"):
            load_program(program)
