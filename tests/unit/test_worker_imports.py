"""A worker process does not import what only the loader and scheduler use."""

import json
import subprocess
import sys

from typhoon.runtime.spec import WorkerSpec
from typhoon.topology import load_topology_text, schedule

CODE = """
import sys
from typhoon.runtime.spec import WorkerSpec
from typhoon.runtime.worker import Worker
spec = WorkerSpec.from_dict(__import__("json").loads(sys.stdin.read()))
print(spec.worker_id, "networkx" in sys.modules)
"""

TOPOLOGY = """
name: imports
spouts:
  - id: source
    operator: sequence_source
bolts:
  - id: sink
    operator: sequence_check
streams:
  - from: source
    to: sink
    grouping: shuffle
"""


def test_worker_start_does_not_import_networkx():
    topo = load_topology_text(TOPOLOGY, "t.yaml")
    phys = schedule(topo, ["h1"], 7)
    wid = phys.of_node("sink")[0].worker_id
    body = json.dumps(WorkerSpec(topo, phys, wid).to_dict())
    out = subprocess.run(
        [sys.executable, "-c", CODE], input=body, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [str(wid), "False"]
