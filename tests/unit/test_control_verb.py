"""``typhoon control`` (typhoon_cli/ctl_control.py) on the REST API in-process, with real
framework workers behind the fake core: each verb is sent, obeyed and confirmed, a
worker that does not obey is named, refusals exit 2 with one line (issue 34)."""

from __future__ import annotations

import json

import pytest
from test_controller_rest import TOKEN, app, call, core, server, typhoon  # noqa: F401
from test_framework import Recorder

from typhoon.operators import resolve_operator
from typhoon.runtime.framework import Framework
from typhoon.runtime.spec import WorkerSpec
from typhoon.wire import Control


@pytest.fixture
def workers(core):  # noqa: F811
    """The fwd app's workers as real Framework instances; the core's PacketOut hands each
    its control tuple and files its METRIC_RESP as the control channel does."""
    topo = core.coordinator.get_topology("fwd")
    physical = core.coordinator.get_physical("fwd")
    fws: dict[int, Framework] = {}
    for w in physical.workers:
        node = topo.nodes[w.node]
        spec = WorkerSpec(topo, physical, w.worker_id, batch_size=100, max_delay_ms=2.0)
        fws[w.worker_id] = Framework(spec, resolve_operator(node.operator)(**node.args), Recorder())
    deaf: set[int] = set()
    fake_send = core.send_control

    def send_control(app_name, worker_ids, ct):
        worker_ids = list(worker_ids)
        for wid in worker_ids:
            if wid in deaf:
                continue
            fw = fws[wid]
            fw.control(ct)
            for reply in fw.io.replies:
                core.responses.setdefault(reply.body["request_id"], {})[wid] = reply.body["metrics"]
            fw.io.replies.clear()
        return fake_send(app_name, worker_ids, ct)

    core.send_control = send_control
    return fws, deaf


def flags(server):  # noqa: F811
    return ["--controller", server, "--token", TOKEN]


def test_each_verb_is_obeyed_and_confirmed(server, core, workers, capsys):  # noqa: F811
    fws, _ = workers
    source = next(w for w, fw in fws.items() if fw.is_spout)
    code, out, err = typhoon(
        capsys, "control", "fwd", "source", "--input-rate", "250", *flags(server)
    )
    assert code == 0, err
    assert out.splitlines() == [
        f"INPUT_RATE rate=250 sent to 1 of 1 worker(s) of source: {source}",
        f"  [ok] worker {source}: rate 250",
    ]
    assert fws[source].rate == 250.0
    code, out, _ = typhoon(capsys, "control", "fwd", "source", "--activate", *flags(server))
    assert code == 0 and fws[source].active and out.endswith(f"[ok] worker {source}: active 1\n")
    code, out, _ = typhoon(capsys, "control", "fwd", "source", "--deactivate", *flags(server))
    assert code == 0 and not fws[source].active and out.endswith(": active 0\n")
    # BATCH_SIZE on a bolt, the max delay given, then kept from what the workers report
    sink = next(w for w, fw in fws.items() if not fw.is_spout)
    argv = ["control", "fwd", "sink", "--batch-size", "7", "--max-delay-ms", "3.5"]
    code, out, _ = typhoon(capsys, *argv, *flags(server))
    assert code == 0 and fws[sink].batch_size == 7 and fws[sink].max_delay == pytest.approx(0.0035)
    assert out.endswith(f"[ok] worker {sink}: batch_size 7, max_delay_ms 3.5\n")
    core.coordinator.put_metrics("fwd", sink, fws[sink].metrics())  # the last METRIC_RESP
    code, out, err = typhoon(capsys, "control", "fwd", "sink", "--batch-size", "3", *flags(server))
    assert code == 0, err
    assert fws[sink].batch_size == 3 and fws[sink].max_delay == pytest.approx(0.0035)
    sent = [ct for _, _, ct in core.sent if ct.type == Control.BATCH_SIZE]
    assert [ct.body for ct in sent] == [
        {"size": 7, "max_delay_ms": 3.5},
        {"size": 3, "max_delay_ms": 3.5},
    ]


def test_metrics_prints_each_workers_answer(server, core, workers, capsys):  # noqa: F811
    fws, _ = workers
    sink = next(w for w, fw in fws.items() if not fw.is_spout)
    code, out, _ = typhoon(capsys, "control", "fwd", "sink", "--metrics", *flags(server))
    lines = out.splitlines()
    assert code == 0 and lines[0] == f"METRIC_REQ sent to 1 of 1 worker(s) of sink: {sink}"
    assert lines[1].split() == ["worker", "in", "out", "queue", "proc_us", "rate", "batch",
                                "delay_ms", "active", "done", "drops", "rtt_ms"]  # fmt: skip
    assert lines[2].split() == [str(sink), "0", "0", "0", "0", "0", "100", "2", "1", "0", "0", "-"]
    code, out, _ = typhoon(capsys, "control", "fwd", "sink", "--metrics", "--json", *flags(server))
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["result"]["no_answer"] == []
    assert doc["result"]["metrics"][str(sink)]["node"] == "sink"


def test_a_worker_that_does_not_obey_is_named(server, core, workers, capsys):  # noqa: F811
    fws, deaf = workers
    source = next(w for w, fw in fws.items() if fw.is_spout)
    deaf.add(source)
    argv = ["control", "fwd", "source", "--input-rate", "10", "--timeout", "0.5", *flags(server)]
    code, out, err = typhoon(capsys, *argv)
    assert code == 1 and out.endswith(f"[NOT CONFIRMED] worker {source}: no answer\n")
    assert err == f"error: worker(s) {source} did not confirm INPUT_RATE within 0.5 s\n"
    code, _, err = typhoon(capsys, "control", "fwd", "source", "--metrics", "--timeout", "0.3",
                           *flags(server))  # fmt: skip
    assert (
        code == 1 and err == f"error: worker(s) {source} did not answer METRIC_REQ within 0.3 s\n"
    )
    # --no-wait: sent, nothing awaited
    code, out, _ = typhoon(capsys, "control", "fwd", "source", "--deactivate", "--no-wait",
                           *flags(server))  # fmt: skip
    assert code == 0 and out.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sink", "--input-rate", "5"], "error: INPUT_RATE paces a spout's emission, and 'sink'"),
        (["sink", "--deactivate"], "error: DEACTIVATE stops a spout's emission, and 'sink' is a"),
        (["ghost", "--activate"], "error: no node named 'ghost' in 'fwd'"),
        (["source", "--input-rate", "-1"], "error: --input-rate takes tuples per second >= 0"),
        (["source", "--batch-size", "0", "--max-delay-ms", "1"], "error: --batch-size takes"),
        (["source", "--batch-size", "5"], "error: --batch-size: give --max-delay-ms too"),
        (["source", "--activate", "--max-delay-ms", "1"], "error: --max-delay-ms goes with"),
    ],
)
def test_refusals_exit_2_with_one_line(server, core, workers, capsys, argv, message):  # noqa: F811
    code, _, err = typhoon(capsys, "control", "fwd", *argv, *flags(server))
    assert code == 2 and err.startswith(message) and err.count("\n") == 1, err
    assert not [ct for _, _, ct in core.sent if ct.type != Control.METRIC_REQ]


def test_flags_are_one_of_the_five(capsys):
    with pytest.raises(SystemExit) as e:
        typhoon(capsys, "control", "fwd", "source", "--activate", "--deactivate")
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        typhoon(capsys, "control", "fwd", "source")


def test_the_raw_endpoint_refuses_protocol_steps_without_force(app, core):  # noqa: F811
    drain = {"type": "DRAIN", "body": {"version": 3}, "node": "source"}
    status, reply = call(app, "POST", "/apps/fwd/control", drain)
    assert status == 400 and reply["error"].startswith("DRAIN is a step of a protocol")
    assert core.sent == []
    status, reply = call(app, "POST", "/apps/fwd/control", {**drain, "force": True})
    assert status == 202 and reply["type"] == "DRAIN" and len(core.sent) == 1
    status, reply = call(app, "POST", "/apps/fwd/control", {"type": "METRIC_REQ"})
    assert status == 202 and isinstance(reply["request_id"], int) and reply["sent"] == 2
