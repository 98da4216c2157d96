"""Schema module: the schema itself is valid and its messages are plain sentences."""

from __future__ import annotations

from jsonschema import Draft202012Validator

from typhoon.topology.schema import SCHEMA, first_problem, show


def problem(doc: object) -> str | None:
    found = first_problem(doc, lambda path: 1)
    return found[1] if found else None


def test_schema_is_a_valid_json_schema() -> None:
    Draft202012Validator.check_schema(SCHEMA)


def test_minimal_document_passes() -> None:
    assert problem({"name": "t", "spouts": [{"id": "s", "operator": "x"}]}) is None


def test_integers_are_strict() -> None:
    base = {"name": "t", "spouts": [{"id": "s", "operator": "x", "parallelism": None}]}
    for bad in (2.0, True, "2"):
        base["spouts"][0]["parallelism"] = bad
        assert problem(base) == (
            f"'parallelism' of spout 's' must be an integer >= 1, not {show(bad)}"
        )


def test_grouping_is_string_or_mapping() -> None:
    doc = {
        "name": "t",
        "spouts": [{"id": "s", "operator": "x"}],
        "streams": [{"from": "s", "to": "b", "grouping": 3}],
    }
    assert problem(doc) == "'grouping' of stream 's' -> 'b' must be a string or a mapping, not 3"


def test_unknown_key_without_close_match_lists_allowed_keys() -> None:
    doc = {"name": "t", "spouts": [{"id": "s", "operator": "x", "zzz": 1}]}
    assert problem(doc) == (
        "unknown key 'zzz' in spout 's' (expected: args, className, config, engine, id, "
        "operator, parallelism, stateful, watermark)"
    )


def test_elements_without_ids_are_numbered() -> None:
    doc = {"name": "t", "spouts": [{"operator": "x"}]}
    assert problem(doc) == "spout 1 is missing 'id'"


def test_show_uses_yaml_words() -> None:
    assert [show(v) for v in (None, True, "a", {}, [], 2.5)] == [
        "empty",
        "true",
        "'a'",
        "a mapping",
        "a list",
        "2.5",
    ]


def test_wrong_type_of_a_whole_section_or_element() -> None:
    assert problem({"name": "t", "spouts": {}}) == (
        "'spouts' of the topology must be a list, not a mapping"
    )
    assert problem({"name": "t", "spouts": [[]]}) == "spout 1 must be a mapping, not a list"
