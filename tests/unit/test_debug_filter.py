"""The debugger's filter language: what matches, what is refused, and that nothing runs."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from typhoon.debug.filter import (
    META_FIELDS,
    FilterError,
    MatchAll,
    check_fields,
    fields_of,
    parse,
)

WORD = {"word": "alpha", "count": 4, "ratio": 0.5, "flag": True, "blob": b"xy", "none": None}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("word=alpha", True),
        ("word==alpha", True),
        ("word='alpha'", True),
        ('word="alpha"', True),
        ("word=beta", False),
        ("word!=beta", True),
        ("word in beta,alpha", True),
        ("word in beta, gamma", False),
        ("WORD=alpha", False),  # field names are case-sensitive
        ("word=alpha AND count=4", True),
        ("word=beta or count>3", True),
        ("word=beta or count>4", False),
        ("count>=4 and count<=4 and count<5 and count>3", True),
        ("count=4.0", True),  # numbers compare as numbers
        ("count='4'", True),  # quoted: as text, and str(4) == "4"
        ("count in 1,2,4", True),
        ("ratio<1", True),
        ("word>aardvark", True),  # text orders as text
        ("word>3", False),  # text and a number do not order
        ("count>abc", False),
        ("flag=true", True),
        ("blob=xy", True),
        ("none=null", True),
        ("missing=1", False),
        ("missing!=1", False),  # a missing field fails every comparison ...
        ("not missing=1", True),  # ... so only `not` turns it around
        ("not (word=alpha or count=1)", False),
        ("(word=beta or word=alpha) and not count in 5,6", True),
        ("  ", True),
        ("", True),
    ],
)
def test_matches(text, expected):
    assert parse(text)(WORD) is expected


def test_and_binds_tighter_than_or():
    f = parse("word=beta and count=4 or word=alpha")
    assert f({"word": "alpha", "count": 0})
    f = parse("word=beta and (count=4 or word=alpha)")
    assert not f({"word": "alpha", "count": 0})


def test_quoted_values_may_hold_spaces_keywords_and_escapes():
    assert parse("s='a b and c'")({"s": "a b and c"})
    assert parse(r"s='it\'s'")({"s": "it's"})
    assert parse("s in 'or', and")({"s": "and"})


def test_meta_fields_name_the_frame():
    f = parse("_dst in 5,6 and _src_node=split")
    assert f({"_dst": 6, "_src_node": "split"})
    assert not f({"_dst": 7, "_src_node": "split"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("word", "expected an operator"),
        ("word=", "expected a value"),
        ("(word=a", "expected ')'"),
        ("word=a count=1", "expected 'and', 'or' or the end"),
        ("word=a and", "expected a field name"),
        ("and=1", "expected a field name"),
        ("1word=a", "is not a field name"),
        ("!word=a", "unexpected character"),
        ("word in", "expected a value"),
        ("word in a,", "expected a value"),
        ('__import__("os").system("x")', "expected an operator"),
        ("word=a; import os", "expected 'and', 'or' or the end"),
        ("word.__class__=a", None),  # parses: a field name, never an attribute
    ],
)
def test_refused(text, message):
    if message is None:
        assert not parse(text)({"word": "a"})
        return
    with pytest.raises(FilterError, match=re.escape(message)):
        parse(text)


def test_limits():
    with pytest.raises(FilterError, match="longer than"):
        parse("a=1 or " * 400 + "a=1")
    with pytest.raises(FilterError, match="deeper"):
        parse("(" * 40 + "a=1" + ")" * 40)
    with pytest.raises(FilterError, match="deeper"):
        parse("not " * 40 + "a=1")


def test_fields_are_checked_against_the_tuples():
    node = parse("word=a or (_dst=3 and cnt>1)")
    assert fields_of(node) == {"word", "_dst", "cnt"}
    check_fields(parse("word=a and _dst=1"), {"word"})
    with pytest.raises(FilterError, match="unknown field.s. cnt: the tuples have word"):
        check_fields(node, {"word"})
    assert set(META_FIELDS) >= {"_src", "_dst", "_stream"}
    assert isinstance(parse(None), MatchAll)


@given(st.text(max_size=60))
def test_any_text_parses_or_is_refused_cleanly(text):
    try:
        f = parse(text)
    except FilterError:
        return
    f(WORD)  # whatever parses evaluates without raising
