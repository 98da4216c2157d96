"""Config keys declared once (typhoon/topology/config.py): the schema, the readers'
defaults and the docs table come from the declaration, and a typo is refused."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from typhoon.checkpoint import DEFAULT_STORE, checkpoint_settings
from typhoon.locality.settings import LocalitySettings
from typhoon.reconfig.steps import DEFAULT_MIGRATION_STEP
from typhoon.runtime import links as lk
from typhoon.runtime.sdn import DEFAULT_CREDIT_TIMEOUT_S
from typhoon.runtime.upstream_backup import DEFAULT_BACKUP_MB
from typhoon.topology import TopologyError, load_topology, load_topology_text
from typhoon.topology.batching import LEGACY_KEYS
from typhoon.topology.config import (
    DEFAULTS,
    NODE_KEYS,
    SDN_DEFAULTS,
    TOPOLOGY_KEYS,
    LocalityConfig,
    NodeConfig,
    SdnConfig,
    TopologyConfig,
)
from typhoon.topology.config_table import BEGIN, END, markdown_table, table_in, with_table
from typhoon.topology.keygroups import DEFAULT_MAX_PARALLELISM
from typhoon.topology.schema import SCHEMA, _validator

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "topology.md"


def test_docs_table_is_the_declarations():
    text = DOC.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert table_in(text) == markdown_table(), (
        "docs/topology.md's table differs from typhoon/topology/config.py: run "
        "`python -m typhoon.topology.config_table docs/topology.md`"
    )


def test_table_has_a_row_per_declared_key():
    table = markdown_table()
    nested = [
        f"{f.name}.{g.name}"
        for f in dataclasses.fields(TopologyConfig)
        if f.metadata["nested"]
        for g in dataclasses.fields(f.metadata["nested"])
    ]
    for key in [*TOPOLOGY_KEYS, *NODE_KEYS, *nested, *LEGACY_KEYS, "spark.*"]:
        assert f"| `{key}` |" in table, key
    assert "| `checkpoint_interval_ms` | number > 0 | `1000` | ms between checkpoints |" in table


def test_a_changed_declaration_shows_in_the_table(monkeypatch):
    before = with_table(f"x\n{BEGIN}\nSTALE TABLE\n{END}\ny\n")
    field = {f.name: f for f in dataclasses.fields(TopologyConfig)}["placement"]
    metadata = dict(field.metadata, doc="where workers go")
    monkeypatch.setattr(field, "metadata", metadata)
    after = with_table(before)
    assert before.startswith(f"x\n{BEGIN}\n") and before.endswith(f"{END}\ny\n")
    assert "STALE TABLE" not in before and "where workers go" in after and after != before


def test_schema_keys_are_the_declared_keys():
    config = SCHEMA["properties"]["config"]
    assert set(config["properties"]) == set(TOPOLOGY_KEYS) | set(LEGACY_KEYS)
    node = SCHEMA["properties"]["spouts"]["items"]["properties"]["config"]
    assert set(node["properties"]) == set(NODE_KEYS)
    for name, cls in (("sdn", SdnConfig), ("locality", LocalityConfig)):
        nested = config["properties"][name]
        assert set(nested["properties"]) == {f.name for f in dataclasses.fields(cls)}
        assert nested["additionalProperties"] is False


def _given(instance) -> dict:
    """A declaration's defaults that are set (not None), nested ones as mappings."""
    out = {}
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if f.metadata["nested"]:
            value = _given(f.metadata["nested"]())
        if value is not None:
            out[f.name] = value
    return out


def test_every_default_passes_its_own_schema():
    doc = {
        "name": "t",
        "config": _given(DEFAULTS),
        "spouts": [{"id": "s", "operator": "x", "config": _given(NodeConfig())}],
    }
    assert doc["config"]["sdn"]["window"] == SDN_DEFAULTS.window
    assert list(_validator().iter_errors(doc)) == []


def test_readers_fall_back_to_the_declared_defaults():
    settings = checkpoint_settings({})
    assert settings.guarantee == DEFAULTS.guarantee
    assert settings.interval_ms == DEFAULTS.checkpoint_interval_ms
    assert settings.store_url == DEFAULT_STORE == DEFAULTS.checkpoint_store
    assert DEFAULT_MAX_PARALLELISM == DEFAULTS.max_parallelism
    assert DEFAULT_MIGRATION_STEP == DEFAULTS.migration_step
    assert DEFAULT_BACKUP_MB == DEFAULTS.upstream_backup_mb
    assert dataclasses.asdict(LocalitySettings()) == dataclasses.asdict(LocalityConfig())
    assert lk.DEFAULT_WINDOW == SDN_DEFAULTS.window
    assert DEFAULT_CREDIT_TIMEOUT_S == SDN_DEFAULTS.credit_timeout_s


def test_typed_config_of_a_file():
    text = (
        "name: t\nconfig: {max_delay: 5, guarantee: at_least_once,"
        " sdn: {mtu: 9000}, spark.master: 'local[1]'}\n"
        "spouts: [{id: s, operator: sequence_source}]\n"
    )
    config = TopologyConfig.of(load_topology_text(text).config)
    assert config.max_delay_ms == 5.0 and config.batch_size == DEFAULTS.batch_size
    assert config.guarantee == "at_least_once"
    assert config.locality is None
    assert TopologyConfig.of({"locality": {"pairs": 9}}).locality == LocalityConfig(pairs=9)
    assert config.sdn == SdnConfig(mtu=9000)
    assert config.placement == "packed" and config.flow_control is True
    assert TopologyConfig.of(None) == DEFAULTS


def topo(config: str) -> str:
    return f"name: t\nconfig: {config}\nspouts: [{{id: src, operator: sequence_source}}]\n"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            "{chekpoint_interval_ms: 5}",
            "t:2: unknown config key 'chekpoint_interval_ms';"
            " did you mean 'checkpoint_interval_ms'?",
        ),
        ("{placment: spread}", "t:2: unknown config key 'placment'; did you mean 'placement'?"),
        (
            "{locality: {pair: 5}}",
            "unknown config key 'locality.pair'; did you mean 'locality.pairs'?",
        ),
        ("{sdn: {zz: 1}}", "unknown config key 'sdn.zz' (known keys: control_priority,"),
        ("{sdn: {window: 0}}", "'config.sdn.window' of the topology must be at least 1, not 0"),
        ("{sdn: {control_priority: maybe}}", "must be true or false, not 'maybe'"),
    ],
)
def test_unknown_or_bad_topology_config(config, message):
    with pytest.raises(TopologyError) as e:
        load_topology_text(topo(config), "t")
    assert message in str(e.value)


def test_unknown_node_config_key_names_the_node():
    text = (
        "name: t\nspouts:\n  - id: src\n    operator: sequence_source\n"
        "    config: {migration_stp: 2}\n"
    )
    with pytest.raises(TopologyError) as e:
        load_topology_text(text, "t")
    assert str(e.value) == (
        "t:5: unknown config key 'migration_stp' in spout 'src'; did you mean 'migration_step'?"
    )
    with pytest.raises(
        TopologyError, match=r"'zzz' in spout 'src' \(known keys: chaining, max_paral"
    ):
        load_topology_text(text.replace("migration_stp", "zzz"), "t")


def test_the_command_line_exits_2_with_the_sentence(tmp_path):
    path = tmp_path / "app.yaml"
    path.write_text(topo("{batch_sise: 10}"))
    cli = [sys.executable, "-m", "typhoon_cli", "validate", str(path)]
    r = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert f"{path}:2: unknown config key 'batch_sise'; did you mean 'batch_size'?" in r.stderr


def test_every_topology_file_in_the_repo_loads():
    files = sorted((ROOT / "topologies").rglob("*.yaml"))
    assert any(f.parent.name == "nexmark" for f in files)
    for f in files:
        load_topology(f)


def _yaml_blocks(path: Path) -> list[object]:
    blocks = re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S)
    out = []
    for block in blocks:
        try:
            out.append(yaml.safe_load(block))
        except yaml.YAMLError:
            continue  # a fragment with `...` in it
    return out


def test_config_keys_in_the_docs_examples_are_declared():
    seen = 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for data in _yaml_blocks(page):
            if not isinstance(data, dict):
                continue
            nodes = [n for k in ("spouts", "bolts") for n in data.get(k) or []]
            configs = [(data.get("config"), TOPOLOGY_KEYS)]
            configs += [(n.get("config"), NODE_KEYS) for n in nodes if isinstance(n, dict)]
            for config, keys in configs:
                if not isinstance(config, dict):
                    continue
                seen += 1
                for key in config:
                    declared = key in keys or key in LEGACY_KEYS or key.startswith("spark.")
                    assert declared, f"{page.name}: config key '{key}' is not declared"
    assert seen
