"""The topology's `config`: known keys only (with a suggestion), guarantee, checkpoints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from typhoon.checkpoint import DEFAULT_STORE, CheckpointSettings, checkpoint_settings, guarantee_of
from typhoon.operators import Spout
from typhoon.topology import Topology, TopologyError, load_topology, load_topology_text

ROOT = Path(__file__).resolve().parents[2]


def topo(config: str, spout: str = "sequence_source") -> str:
    return f"name: t\nconfig: {config}\nspouts: [{{id: src, operator: {spout}}}]\n"


class NoReplay(Spout):
    """A user spout that cannot tell where it is."""

    fields = ("x",)

    def next_batch(self, emit, max_count):
        return False


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{batchsize: 10}", "t:2: unknown config key 'batchsize'; did you mean 'batch_size'?"),
        ("{gaurantee: exactly_once}", "unknown config key 'gaurantee'; did you mean 'guarantee'?"),
        ("{checkpoint_intervall: 5}", "did you mean 'checkpoint_interval_ms'?"),
        (
            "{zzz: 1}",
            "unknown config key 'zzz' (known keys: batch_size, chaining, checkpoint_interval_ms",
        ),
        ("{guarantee: exactly-once}", "must be one of none, at_least_once, exactly_once"),
        ("{checkpoint_interval_ms: 0}", "'config.checkpoint_interval_ms' of the topology must be"),
        ("{checkpoint_interval_ms: -5}", "greater than 0, not -5"),
        ("{checkpoint_interval_ms: fast}", "must be a number, not 'fast'"),
        ("{checkpoint_store: 12}", "'config.checkpoint_store' of the topology must be a string"),
        ("{batch_size: 0}", "'config.batch_size' of the topology must be at least 1"),
        ("{flow_control: maybe}", "'config.flow_control' of the topology must be true or false"),
    ],
)
def test_bad_config(config, message):
    with pytest.raises(TopologyError) as e:
        load_topology_text(topo(config), "t")
    assert message in str(e.value)


def test_known_config_keys_load():
    config = (
        "{batch_size: 10, max_delay_ms: 2.5, max_delay: 3, sdn: {mtu: 9000}, flow_control: false,"
        " output_dir: /tmp/x, spark.master: 'local[2]', spark.sql.shuffle.partitions: 2,"
        " guarantee: exactly_once, checkpoint_interval_ms: 250, checkpoint_store: 's3://b/ck'}"
    )
    t = load_topology_text(topo(config))
    assert t.config["spark.master"] == "local[2]"
    assert checkpoint_settings(t) == CheckpointSettings("exactly_once", 250.0, "s3://b/ck")
    assert load_topology_text(topo("")).config == {}


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_guarantee_needs_replayable_spouts(guarantee):
    ref = f"{__name__}:NoReplay"
    text = topo(f"{{guarantee: {guarantee}}}", ref)
    with pytest.raises(TopologyError) as e:
        load_topology_text(text, "t")
    assert str(e.value) == (
        f"t:3: spout 'src' uses operator '{ref}', which cannot replay its input (it does not "
        f"implement offset() and seek()), so the topology cannot have guarantee '{guarantee}'"
    )
    assert guarantee_of(load_topology_text(topo("{guarantee: none}", ref))) == "none"
    assert guarantee_of(load_topology_text(topo("{}", ref))) == "none"


@pytest.mark.parametrize(
    "spout",
    [
        "sequence_source",
        "sentence_source",
        "ad_event_source",
        "keyed_source",
        "file_source, args: {path: /x.txt}",
    ],
)
def test_every_builtin_source_allows_exactly_once(spout):
    t = load_topology_text(topo("{guarantee: exactly_once}", spout))
    assert guarantee_of(t) == "exactly_once"


def test_settings_defaults_and_plain_dicts():
    assert checkpoint_settings({}) == CheckpointSettings("none", 1000.0, DEFAULT_STORE)
    assert not checkpoint_settings({}).enabled
    s = checkpoint_settings(Topology("t", {}, [], {"guarantee": "at_least_once"}))
    assert s.enabled and s.guarantee == "at_least_once" and s.store_url == DEFAULT_STORE
    with pytest.raises(AttributeError):
        s.guarantee = "none"  # type: ignore[misc]
    with pytest.raises(ValueError, match="guarantee must be one of"):
        guarantee_of({"guarantee": "sometimes"})
    with pytest.raises(ValueError, match="checkpoint_interval_ms must be a number > 0"):
        checkpoint_settings({"checkpoint_interval_ms": 0})
    with pytest.raises(ValueError, match="checkpoint_store must be a URL"):
        checkpoint_settings({"checkpoint_store": 5})


def test_every_shipped_topology_still_validates():
    files = sorted((ROOT / "topologies").glob("*.yaml"))
    assert files
    for f in files:
        load_topology(f)
    cli = [sys.executable, "-m", "typhoon_cli", "validate", str(files[0])]
    r = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
