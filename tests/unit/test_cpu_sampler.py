"""The benchmark's CPU-by-process sampler: grouping processes and charging stretches."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.cpu_sampler import CpuSampler, Sample, classify, node_of_spec
from typhoon.supervised import command_line


def test_processes_are_grouped_by_what_they_run() -> None:
    assert classify(["ovs-vswitchd", "unix:/var/run/db.sock"], 1, 2) == "ovs-vswitchd"
    assert classify(["/v/bin/python", "/v/bin/ryu-manager", "--config-file", "c"], 1, 2) == (
        "controller"
    )
    assert classify(["python", "-m", "controller.framework.launcher"], 1, 2) == "controller"
    assert classify(["python", "-m", "typhoon.runtime.worker", "w.spec.json"], 1, 2) == "worker"
    assert classify(["python", "-m", "typhoon.debug.worker", "x"], 1, 2) == "debug worker"
    assert classify(["python", "-m", "typhoon.agent", "--host", "h1"], 1, 2) == "agents"
    zygote = ["python", "-m", "typhoon.runtime.zygote_server", "--fd", "5"]
    assert classify(zygote, 1, 2) == "worker zygote"
    assert classify(["bash"], 1, 2) is None
    assert classify([], 1, 2) is None
    assert classify(["anything"], 7, 7) == "benchmark process (client)"


def test_a_worker_is_named_by_the_node_its_spec_gives(tmp_path: Path) -> None:
    spec = tmp_path / "worker-3.spec.json"
    physical = {"workers": [{"worker_id": 2, "node": "a"}, {"worker_id": 3, "node": "sink"}]}
    spec.write_text(json.dumps({"worker_id": 3, "physical": physical}))
    assert node_of_spec(str(spec)) == "sink"
    cmd = ["python", "-m", "typhoon.runtime.worker", str(spec)]
    assert CpuSampler._group(cmd, 1, 2) == "worker sink"
    # forked by the zygote: one title (setproctitle), as psutil reads it, split back
    retitled = command_line([" ".join(cmd), "", ""])
    assert CpuSampler._group(retitled, 1, 2) == "worker sink"
    spec.write_text("{not json")
    assert node_of_spec(str(spec)) is None
    assert node_of_spec(str(tmp_path / "missing.json")) is None


def test_cores_charge_each_group_over_the_stretch_only() -> None:
    s = CpuSampler()
    s.groups = {10: "worker source", 11: "worker sink", 12: "debug worker"}
    s.started = {10: 0.0, 11: 0.0, 12: 104.5}
    s.samples = [
        Sample(100.0, {10: 5.0, 11: 1.0}, busy=20.0),
        Sample(102.0, {10: 6.0, 11: 1.5}, busy=21.6),
        Sample(104.0, {10: 7.0, 11: 2.0}, busy=23.2),
        Sample(106.0, {10: 8.0, 11: 2.5, 12: 0.4}, busy=25.2, steal=0.2),
        Sample(108.0, {10: 9.0, 11: 3.0, 12: 0.6}, busy=27.0, steal=0.2),
    ]
    before = s.cores(100.0, 104.0)
    assert before["worker source"] == 0.5 and before["worker sink"] == 0.25
    assert "debug worker" not in before
    assert before["other processes and the kernel"] == 0.05  # 0.8 busy - 0.75 ours
    attached = s.cores(104.0, 108.0)
    assert attached["debug worker"] == 0.15  # started inside: charged from zero (0.6 s / 4 s)
    assert attached["stolen by the hypervisor"] == 0.05
    assert s.cores(200.0, 300.0) == {}  # no samples there


def test_the_cpu_tables_total_leaves_out_what_the_hypervisor_took() -> None:
    from benchmarks.live_debug_report import VARIANTS, cpu_table

    run = {"worker source": 0.8, "ovs-vswitchd": 0.3, "stolen by the hypervisor": 0.5}
    per = {v: [{"cpu_cores_before": run, "cpu_cores_attached": run}] for v in VARIANTS}
    rows = {r[0]: r for r in cpu_table(per).rows}
    assert rows["total"][1:3] == ["1.10", "1.10"]
