"""Spark's Python daemon without Spark's archives on the path (``spark.python.daemon.module``).

Spark starts its Python workers (and the planners of Python data sources)
from ``python -m pyspark.daemon`` with ``pyspark.zip``, the py4j zip and the
spark-core jar first on ``PYTHONPATH``.  With pyspark installed as a package
(pip, as here), the workers then import pyspark from the zip: compiled from
source in every daemon, no bytecode cache.  And every task calls
``importlib.invalidate_caches()`` (``pyspark.worker_util.setup_spark_files``),
which makes each zip importer read its archive's directory again: 0.26 CPU-s
per task on this machine, more than the task's rows cost.

This module drops those archives from ``sys.path`` when pyspark and py4j can
be imported without them, then runs ``pyspark.daemon`` as Spark would.  With
Spark's own distribution (no pyspark package) the path is left as it is.
"""

from __future__ import annotations

import os
import runpy
import sys
from importlib.machinery import PathFinder


def strip_spark_archives(path: list[str], home: str) -> list[str]:
    """``path`` without the zips and jars under ``home`` (SPARK_HOME), if pyspark and py4j
    import from the rest; otherwise ``path`` unchanged."""
    if not home:
        return path
    home = os.path.join(os.path.realpath(home), "")
    archives = {
        p for p in path if p.endswith((".zip", ".jar")) and os.path.realpath(p).startswith(home)
    }
    rest = [p for p in path if p not in archives]
    if not archives or any(PathFinder.find_spec(m, rest) is None for m in ("pyspark", "py4j")):
        return path
    return rest


def main() -> None:
    kept = strip_spark_archives(sys.path, os.environ.get("SPARK_HOME", ""))
    for p in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(p, None)  # a zip importer made while finding this module
    sys.path[:] = kept
    # as `python -m pyspark.daemon WORKER_MODULE`: the daemon reads its worker module in argv
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
