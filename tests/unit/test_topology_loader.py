"""Topology loader: every good fixture loads, every bad one fails with its exact line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from typhoon.topology import (
    Grouping,
    Topology,
    TopologyError,
    load_topology,
    load_topology_text,
)

FIXTURES = Path(__file__).parent / "fixtures" / "topologies"
GOOD = sorted((FIXTURES / "good").glob("*.yaml"))
BAD = sorted((FIXTURES / "bad").glob("*.yaml"))
ENV_VARS = (
    "TYPHOON_TEST_APP_NAME",
    "TYPHOON_TEST_BATCH",
    "TYPHOON_TEST_OUT",
    "TYPHOON_TEST_COUNT",
    "TYPHOON_TEST_PAR",
    "TYPHOON_TEST_ENGINE",
    "TYPHOON_TEST_SURELY_UNSET",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixtures must not depend on the developer's shell."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def load_good(name: str) -> Topology:
    return load_topology(FIXTURES / "good" / name)


def test_fixture_sets_are_complete() -> None:
    assert len(GOOD) >= 5 and len(BAD) >= 30
    expected = {p.stem for p in (FIXTURES / "bad").glob("*.expected")}
    assert expected == {p.stem for p in BAD}


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_good_fixture_loads(path: Path) -> None:
    topo = load_topology(path)
    assert topo.nodes and topo.source_file == str(path)
    assert [s.id for s in topo.streams] == list(range(1, len(topo.streams) + 1))
    again = Topology.from_dict(topo.to_dict())
    assert again.to_dict() == topo.to_dict()


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_bad_fixture_fails_with_expected_line(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(path.parent)  # errors name the file as given: the basename here
    expected = path.with_suffix(".expected").read_text().strip()
    with pytest.raises(TopologyError) as err:
        load_topology(path.name)
    assert str(err.value) == expected
    assert "\n" not in str(err.value)


def test_all_groupings_are_used_by_good_fixtures() -> None:
    from typhoon.topology import GROUPINGS

    used = {s.grouping.type for p in GOOD for s in load_topology(p).streams}
    assert used == set(GROUPINGS)


def test_wordcount_model() -> None:
    topo = load_good("wordcount.yaml")
    assert topo.name == "wordcount" and topo.config == {"batch_size": 100}
    assert list(topo.nodes) == ["source", "split", "count"]
    count = topo.nodes["count"]
    assert (count.kind, count.operator, count.parallelism, count.stateful) == (
        "bolt",
        "count_by_key",
        4,
        True,
    )
    assert topo.nodes["source"].args == {"count": 10000, "seed": 1}
    assert topo.nodes["source"].line == 5
    assert [n.output_fields for n in topo.nodes.values()] == [
        ("sentence",),
        ("word",),
        ("key", "count"),
    ]
    s1, s2 = topo.streams
    assert (s1.id, s1.src, s1.dst, s1.grouping, s1.line) == (
        1,
        "source",
        "split",
        Grouping("shuffle"),
        20,
    )
    assert (s2.id, s2.grouping, s2.name) == (2, Grouping("fields", ("word",)), "default")


def test_direct_table_and_named_streams() -> None:
    topo = load_good("all_groupings.yaml")
    direct = next(s for s in topo.streams if s.grouping.type == "direct")
    assert direct.grouping == Grouping("direct", ("word",), {"the": 0, "a": 1, "of": 1})
    names = {s.dst: s.name for s in load_good("named_streams.yaml").streams}
    assert names == {"route": "default", "main": "default", "late": "late", "errors": "errors"}


def test_flux_spellings_and_env_defaults() -> None:
    topo = load_good("env_flux.yaml")
    assert topo.name == "env-flux"
    assert topo.config == {"batch_size": 64, "output_dir": "/tmp/typhoon"}
    assert topo.nodes["source"].args == {"count": 500, "seed": 7}
    assert (topo.nodes["split"].parallelism, topo.nodes["split"].engine) == (3, "spark")
    assert topo.streams[1].grouping == Grouping("fields", ("word",))


def test_env_values_override_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TYPHOON_TEST_APP_NAME", "from-env")
    monkeypatch.setenv("TYPHOON_TEST_PAR", "5")
    monkeypatch.setenv("TYPHOON_TEST_OUT", "/data")
    monkeypatch.setenv("TYPHOON_TEST_ENGINE", "python")
    topo = load_good("env_flux.yaml")
    assert topo.name == "from-env"
    assert topo.nodes["split"].parallelism == 5  # unquoted: typed like YAML would
    assert topo.nodes["split"].engine == "python"
    assert topo.config["output_dir"] == "/data/typhoon"  # inside a string: stays a string


def test_quoted_substitution_stays_a_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TYPHOON_TEST_COUNT", "12")
    text = """\
name: t
config:  # spark.* keys pass through unchecked, so they keep whatever type YAML gives
  spark.quoted: "${TYPHOON_TEST_COUNT}"
  spark.plain: ${TYPHOON_TEST_COUNT}
  spark.inside: n=${TYPHOON_TEST_COUNT}
spouts: [{id: s, operator: sentence_source}]
"""
    assert load_topology_text(text).config == {
        "spark.quoted": "12",
        "spark.plain": 12,
        "spark.inside": "n=12",
    }


def test_module_class_operator_and_allow_imports() -> None:
    text = (
        "name: t\n"
        "spouts: [{id: s, operator: sentence_source}]\n"
        "bolts: [{id: b, operator: 'typhoon.operators.transforms:SplitWords'}]\n"
        "streams: [{from: s, to: b, grouping: shuffle}]\n"
    )
    topo = load_topology_text(text, "t.yaml")
    assert topo.nodes["b"].output_fields == ("word",)
    with pytest.raises(TopologyError) as err:
        load_topology_text(text, "t.yaml", allow_imports=False)
    assert str(err.value) == (
        "t.yaml:3: bolt 'b': operator 'typhoon.operators.transforms:SplitWords' would import "
        "code; only built-in operators are allowed here"
    )


def test_first_input_stream_decides_input_fields() -> None:
    text = """\
name: join
spouts:
  - {id: words, operator: sentence_source}
  - {id: numbers, operator: sequence_source}
bolts:
  - {id: pass, operator: identity}
streams:
  - {from: words, to: pass, grouping: shuffle}
  - {from: numbers, to: pass, grouping: {type: fields, fields: [seq]}}
"""
    topo = load_topology_text(text)
    assert topo.nodes["pass"].output_fields == ("sentence",)


def test_error_carries_file_line_and_message() -> None:
    with pytest.raises(TopologyError) as err:
        load_topology_text("name: t\nspouts: []\n", "x.yaml")
    assert (err.value.file, err.value.line) == ("x.yaml", 2)
    assert err.value.message == "'spouts' must list at least one spout"


def test_error_survives_pickling() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(TopologyError("a.yaml", 3, "bad")))
    assert (str(err), err.file, err.line, err.message) == ("a.yaml:3: bad", "a.yaml", 3, "bad")


def test_direct_table_keys_are_strings() -> None:
    text = """\
name: t
spouts: [{id: s, operator: sequence_source}]
bolts: [{id: b, operator: collect, parallelism: 2}]
streams:
  - from: s
    to: b
    grouping:
      type: direct
      fields: [src]
      table:
        1: 0
        yes: 1
        on: 1
"""
    topo = load_topology_text(text)  # `yes`/`on` keys stay words, not YAML 1.1 booleans
    assert topo.streams[0].grouping.table == {"1": 0, "yes": 1, "on": 1}
    with pytest.raises(TopologyError) as err:
        load_topology_text(text.replace("on:", "1.5:"), "t.yaml")
    assert str(err.value) == (
        "t.yaml:13: stream 's' -> 'b': direct table key 1.5 is not a string or integer; quote it"
    )


def test_path_is_named_as_given(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("name: t\n")
    with pytest.raises(TopologyError, match=f"^{path}:1: the topology is missing 'spouts'$"):
        load_topology(path)


def test_unreadable_file() -> None:
    with pytest.raises(TopologyError, match=r"^no/such\.yaml: cannot read the file"):
        load_topology("no/such.yaml")


def test_earliest_problem_is_reported() -> None:
    text = "name: t\nspouts:\n  - {id: s, operator: x, parallelism: 0}\n  - {id: t, speed: 1}\n"
    with pytest.raises(TopologyError, match="^<string>:3: 'parallelism' of spout 's'"):
        load_topology_text(text)


def test_yaml_anchors_and_aliases_are_fine() -> None:
    text = """\
name: t
spouts:
  - {id: s, operator: sequence_source, args: &small {count: 5}}
  - {id: u, operator: sequence_source, args: *small}
"""
    topo = load_topology_text(text)
    assert topo.nodes["u"].args == {"count": 5}


def test_recursive_alias_is_an_error() -> None:
    with pytest.raises(TopologyError, match="recursive YAML alias"):
        load_topology_text("name: t\nspouts: &a [*a]\n")


def test_python_tags_are_refused() -> None:
    with pytest.raises(TopologyError, match="^<string>:1: YAML syntax: could not determine"):
        load_topology_text("name: !!python/object:os.system x\nspouts: []\n")


def test_control_characters_are_a_yaml_error_not_a_crash() -> None:
    # the YAML reader refuses them as it is made (REST submit got a 500 for this body)
    with pytest.raises(TopologyError, match="^<string>:1: YAML syntax: unacceptable character"):
        load_topology_text("0\x1f")


WORDS = [
    "s",
    "word",
    "src",
    "fields",
    "direct",
    "ALL",
    "sdn",
    "split_words",
    "count_by_key",
    "sentence_source",
    "spark",
    "source",
    "split",
    "count",
    "${TYPHOON_TEST_PAR:-2}",
]
LEAVES = st.none() | st.booleans() | st.integers(-1, 5) | st.floats(-1, 5) | st.sampled_from(WORDS)
LEAF_OR_LIST = (
    LEAVES | st.lists(LEAVES, max_size=3) | st.dictionaries(st.sampled_from(WORDS), LEAVES)
)


def mutate(doc: Any, data: st.DataObject, depth: int = 0) -> Any:
    """Replace, drop or rename one element somewhere inside ``doc`` (never the root)."""
    if not isinstance(doc, (dict, list)) or not doc or depth and data.draw(st.integers(0, 3)) == 0:
        return data.draw(LEAF_OR_LIST)
    keys = list(doc) if isinstance(doc, dict) else list(range(len(doc)))
    key = data.draw(st.sampled_from(keys))
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    action = data.draw(st.sampled_from(["recurse", "drop", "rename"]))
    if action == "drop":
        del copy[key]
    elif action == "rename" and isinstance(copy, dict):
        copy[data.draw(st.sampled_from(WORDS))] = copy.pop(key)
    else:
        copy[key] = mutate(copy[key], data, depth + 1)
    return copy


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(GOOD), st.integers(1, 3), st.data())
def test_mutated_fixture_loads_or_fails_with_one_line(
    path: Path, rounds: int, data: st.DataObject
) -> None:
    doc = yaml.safe_load(path.read_text())
    for _ in range(rounds):
        doc = mutate(doc, data)
    try:
        load_topology_text(yaml.safe_dump(doc), "fuzz.yaml")
    except TopologyError as e:
        assert str(e).startswith("fuzz.yaml:") and "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab:-{}[]#&*!|>'\"\n ${}%@`,?0", max_size=60))
def test_any_text_loads_or_fails_with_one_line(text: str) -> None:
    try:
        load_topology_text(text, "fuzz.yaml")
    except TopologyError as e:
        assert str(e).startswith("fuzz.yaml:") and "\n" not in str(e)
