"""Spark engine for ``engine: spark`` nodes (docs/design.md §7).

Named in ``typhoon.operators.engine_modules``.

A spark node names a PySpark function ``DataFrame -> DataFrame``
(``operator: module:function``).  Its workers (``node.SparkBolt``) append
received tuples to an offset log and route what Spark publishes; one Spark
driver per host (``driver.py``) runs a Structured Streaming query per node
between the ``typhoon`` source and sink (``source.py``).

Spark node args: ``fields`` (output columns), ``schema`` (input field ->
Spark SQL type; others are strings), ``output_mode`` (append | update |
complete), ``trigger_ms``, ``params`` (keyword arguments of the function),
``dir`` (state directory; set by ``plan``), ``guarantee`` (set by ``plan`` from
the topology's ``config: guarantee``), ``cut_batches`` (under a guarantee: end
a batch at every checkpoint, ``anchors.py``), ``segment_bytes``,
``time_field`` (the input's event time: rows below the fabric's watermark are
counted, ``watermarks.py``), and
``spark.*`` settings; ``spark.*`` in the topology config apply to every node.
``spark.master`` picks the cluster (default: embedded ``local[*]``).

Importing this package does not import pyspark: workers never need it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from typhoon.checkpoint.settings import guarantee_of
from typhoon.engines import EngineService
from typhoon.topology.model import PhysicalTopology, Topology

__all__ = ["bolt_for", "plan"]

DEFAULT_MASTER = "local[*]"
DEFAULT_TRIGGER_MS = 200
_bolts: dict[str, type] = {}


def bolt_for(operator: str) -> type:
    """The bolt class a spark node's workers run for the function ``operator``."""
    from pyspark_bridge.node import SparkBolt, load_function

    if operator not in _bolts:
        load_function(operator)  # fails now, at load time, for a bad name
        _bolts[operator] = type(f"SparkBolt[{operator}]", (SparkBolt,), {"function": operator})
    return _bolts[operator]


def _input_fields(topology: Topology, node: str) -> list[str]:
    ins = topology.inputs_of(node)
    return list(topology.nodes[ins[0].src].output_fields) if ins else []


def session_conf(topology: Topology, args: dict[str, Any]) -> dict[str, str]:
    """Spark settings of a node's session: topology config, then node args (spark.sql.* apart)."""
    conf = {"spark.master": DEFAULT_MASTER}
    for source in (topology.config, args):
        conf.update(
            {
                k: str(v)
                for k, v in source.items()
                if k.startswith("spark.") and not k.startswith("spark.sql.")
            }
        )
    return conf


def sql_conf(topology: Topology, args: dict[str, Any]) -> dict[str, str]:
    """Per-query SQL settings (``spark.sql.*``), set on the session before the query starts."""
    conf: dict[str, str] = {}
    for source in (topology.config, args):
        conf.update({k: str(v) for k, v in source.items() if k.startswith("spark.sql.")})
    return conf


def plan(
    topology: Topology, physical: PhysicalTopology, workdir: Path
) -> tuple[Topology, list[EngineService]]:
    """One driver per (host, session settings) for the spark nodes whose first worker is there.

    Fills in each spark node's ``dir`` (``<workdir>/spark/<node>`` unless given)
    and writes each driver's plan file; the returned services start the drivers.
    A node's workers and its driver share ``dir``: on several hosts it must be
    shared storage (NFS), or the node's workers must sit on the driver's host.
    """
    from pyspark_bridge.node import input_ddl

    topology = Topology.from_dict(topology.to_dict())
    root = Path(workdir).resolve() / "spark"
    guarantee = guarantee_of(topology)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for node in topology.nodes.values():
        if node.engine != "spark":
            continue
        args = node.args
        args.setdefault("dir", str(root / node.name))
        if guarantee != "none":
            args["guarantee"] = guarantee  # the workers checkpoint with the job (anchors.py)
        workers = physical.of_node(node.name)
        conf = session_conf(topology, args)
        spec = {
            "node": node.name,
            "function": node.operator,
            "params": dict(args.get("params") or {}),
            "dir": args["dir"],
            "schema": input_ddl(args, _input_fields(topology, node.name)),
            "fields": list(node.output_fields),
            "output_mode": args.get("output_mode", "append"),
            "trigger_ms": int(args.get("trigger_ms", DEFAULT_TRIGGER_MS)),
            "workers": [w.worker_id for w in workers],
            "sql_conf": sql_conf(topology, args),
            "guarantee": guarantee != "none",
            "cut_batches": guarantee != "none" and bool(args.get("cut_batches", False)),
        }
        key = (workers[0].host, json.dumps(conf, sort_keys=True))
        groups.setdefault(key, []).append(spec)
    services = []
    root.mkdir(parents=True, exist_ok=True)
    for i, ((host, conf_text), nodes) in enumerate(sorted(groups.items())):
        name = f"spark-driver-{host}" + (f"-{i}" if len(groups) > 1 else "")
        path = root / f"{name}.json"
        doc = {"app": topology.name, "host": host, "conf": json.loads(conf_text), "nodes": nodes}
        path.write_text(json.dumps(doc, indent=1))
        argv = [sys.executable, "-m", "pyspark_bridge.driver", str(path)]
        services.append(
            EngineService(
                name,
                host,
                argv,
                [n["node"] for n in nodes],
                ready_file=str(path.with_suffix(".ready")),
            )
        )
    return topology, services
