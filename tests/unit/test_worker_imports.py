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


LAZY = """
import sys
import typhoon.runtime.worker
from typhoon.operators import BUILTINS, resolve_operator
loaded = lambda: sorted(m for m in sys.modules if m.startswith("typhoon.operators."))
before = loaded()
cls = resolve_operator("split_words")
print(" ".join(before))
print(" ".join(m for m in loaded() if m not in before), cls.__name__, "split_words" in BUILTINS)
print(" ".join(m for m in ("yaml", "jsonschema", "typhoon.topology.loader") if m in sys.modules))
"""


def test_runtime_imports_no_operator_module_until_one_is_used():
    out = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, check=True)
    before, resolved, heavy = out.stdout.split("\n")[:3]
    # only the base classes and the time helpers the runtime itself uses
    assert set(before.split()) <= {
        "typhoon.operators.base",
        "typhoon.operators.builtins",
        "typhoon.operators.windowing",
    }
    assert resolved.split() == ["typhoon.operators.transforms", "SplitWords", "True"]
    assert heavy == ""  # the topology loader (YAML, schema) is not a worker's import
