"""pyspark_bridge.pydaemon: Spark's archives leave the workers' path only when pyspark and
py4j import without them."""

from __future__ import annotations

from pathlib import Path

from pyspark_bridge.pydaemon import strip_spark_archives


def package(root: Path, name: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")


def test_archives_under_spark_home_go_when_pyspark_and_py4j_import_from_elsewhere(tmp_path):
    home, site = tmp_path / "pyspark", tmp_path / "site"
    package(site, "pyspark")
    package(site, "py4j")
    zips = [str(home / "python" / "lib" / "pyspark.zip"), str(home / "jars" / "core.jar")]
    other = str(tmp_path / "mine.zip")  # a user's archive outside SPARK_HOME stays
    path = [str(tmp_path), *zips, other, str(site)]
    assert strip_spark_archives(path, str(home)) == [str(tmp_path), other, str(site)]


def test_path_unchanged_without_an_installed_pyspark_or_spark_home(tmp_path):
    home, site = tmp_path / "spark", tmp_path / "site"
    package(site, "py4j")  # pyspark only in the zip: Spark's own distribution
    path = [str(home / "python" / "lib" / "pyspark.zip"), str(site)]
    assert strip_spark_archives(path, str(home)) == path
    package(site, "pyspark")
    assert strip_spark_archives(path, "") == path
    assert strip_spark_archives([str(site)], str(home)) == [str(site)]
