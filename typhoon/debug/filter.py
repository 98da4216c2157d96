"""The debugger's filter language: field comparisons joined by and/or, parsed, never eval'd.

A filter runs inside the debug worker on every mirrored tuple and comes from
whoever may attach a debugger, so it is a tiny language of its own instead of
Python: nothing in it can name a function, an attribute or a module.

Grammar (keywords are case-insensitive)::

    expr    := conj ("or" conj)*
    conj    := unary ("and" unary)*
    unary   := "not" unary | "(" expr ")" | compare
    compare := FIELD OP VALUE | FIELD "in" VALUE ("," VALUE)*
    OP      := "=" | "==" | "!=" | "<" | "<=" | ">" | ">="
    VALUE   := a bare word (123, 2.5, alpha) | 'quoted' | "quoted"

Examples: ``word=alpha``, ``word in alpha,beta``, ``count>3 and word!=x``,
``(_dst=5 or _dst=6) and not word in a,b``.

Semantics.  FIELD names a field of the tuple (its node's output fields) or a
frame property: ``_src``/``_dst`` (worker ids), ``_src_node``/``_dst_node``,
``_stream``.  A tuple without the field fails every comparison.  An unquoted
number compares numerically with a numeric field; otherwise values compare as
text (``word=3`` matches the string "3", ``count=3`` the integer 3).  ``<``,
``>`` compare numbers with numbers and text with text, anything else is false.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_LENGTH = 2000
MAX_DEPTH = 32
META_FIELDS = ("_src", "_dst", "_src_node", "_dst_node", "_stream")
OPS = ("=", "==", "!=", "<", "<=", ">", ">=")
_KEYWORDS = {"and", "or", "not", "in"}

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<op>==|!=|<=|>=|=|<|>)
      | (?P<punct>[(),])
      | (?P<quoted>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
      | (?P<word>[^\s()=<>!,'"]+)
    )""",
    re.VERBOSE,
)
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_NUMBER = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")
_INT = re.compile(r"[+-]?\d+")


class FilterError(ValueError):
    """A filter expression that does not parse; the message says where and why."""


@dataclass(frozen=True)
class Literal:
    """One value as written: its text, and its number if it was an unquoted number."""

    text: str
    number: int | float | None = None


def _literal(kind: str, raw: str) -> Literal:
    if kind == "quoted":
        return Literal(re.sub(r"\\(.)", r"\1", raw[1:-1]))
    if _INT.fullmatch(raw):
        return Literal(raw, int(raw))
    if _NUMBER.fullmatch(raw):
        return Literal(raw, float(raw))
    return Literal(raw)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _equal(value: Any, lit: Literal) -> bool:
    if lit.number is not None and _is_number(value):
        return value == lit.number
    return _as_text(value) == lit.text


def _order(value: Any, lit: Literal) -> tuple[Any, Any] | None:
    """The two sides of an ordering comparison, or None if they do not compare."""
    if lit.number is not None and _is_number(value):
        return value, lit.number
    if lit.number is None and isinstance(value, str):
        return value, lit.text
    return None


_ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


@dataclass(frozen=True)
class Compare:
    field: str
    op: str  # one of OPS, or "in"
    values: tuple[Literal, ...]

    def __call__(self, record: Mapping[str, Any]) -> bool:
        if self.field not in record:
            return False
        value = record[self.field]
        if self.op in ("=", "==", "in"):
            return any(_equal(value, v) for v in self.values)
        if self.op == "!=":
            return not _equal(value, self.values[0])
        sides = _order(value, self.values[0])
        return sides is not None and _ORDERINGS[self.op](*sides)


@dataclass(frozen=True)
class And:
    parts: tuple[Node, ...]

    def __call__(self, record: Mapping[str, Any]) -> bool:
        return all(p(record) for p in self.parts)


@dataclass(frozen=True)
class Or:
    parts: tuple[Node, ...]

    def __call__(self, record: Mapping[str, Any]) -> bool:
        return any(p(record) for p in self.parts)


@dataclass(frozen=True)
class Not:
    part: Node

    def __call__(self, record: Mapping[str, Any]) -> bool:
        return not self.part(record)


@dataclass(frozen=True)
class MatchAll:
    """The empty filter."""

    def __call__(self, record: Mapping[str, Any]) -> bool:
        return True


Node = Compare | And | Or | Not | MatchAll


def fields_of(node: Node) -> set[str]:
    """Every field name a filter reads (to check them against the tuples' fields)."""
    if isinstance(node, Compare):
        return {node.field}
    if isinstance(node, (And, Or)):
        return set().union(*(fields_of(p) for p in node.parts))
    if isinstance(node, Not):
        return fields_of(node.part)
    return set()


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, position)
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                raise FilterError(f"unexpected character {text[pos]!r} at position {pos}")
            kind = m.lastgroup
            assert kind is not None
            self.tokens.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def keyword(self, word: str) -> bool:
        tok = self.peek()
        if tok and tok[0] == "word" and tok[1].lower() == word:
            self.i += 1
            return True
        return False

    def punct(self, p: str) -> bool:
        tok = self.peek()
        if tok and tok[0] == "punct" and tok[1] == p:
            self.i += 1
            return True
        return False

    def fail(self, what: str) -> FilterError:
        tok = self.peek()
        where = f"'{tok[1]}' at position {tok[2]}" if tok else "the end"
        return FilterError(f"expected {what}, found {where}")

    def expr(self, depth: int) -> Node:
        parts = [self.conj(depth)]
        while self.keyword("or"):
            parts.append(self.conj(depth))
        return parts[0] if len(parts) == 1 else Or(tuple(parts))

    def conj(self, depth: int) -> Node:
        parts = [self.unary(depth)]
        while self.keyword("and"):
            parts.append(self.unary(depth))
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def unary(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise FilterError(f"filter nests deeper than {MAX_DEPTH} levels")
        if self.keyword("not"):
            return Not(self.unary(depth + 1))
        if self.punct("("):
            inner = self.expr(depth + 1)
            if not self.punct(")"):
                raise self.fail("')'")
            return inner
        return self.compare()

    def value(self) -> Literal:
        tok = self.peek()
        if tok is None or tok[0] not in ("word", "quoted"):
            raise self.fail("a value")
        self.i += 1
        return _literal(tok[0], tok[1])

    def compare(self) -> Compare:
        tok = self.peek()
        if tok is None or tok[0] != "word" or tok[1].lower() in _KEYWORDS:
            raise self.fail("a field name")
        if not _FIELD.fullmatch(tok[1]):
            raise FilterError(f"'{tok[1]}' at position {tok[2]} is not a field name")
        self.i += 1
        field = tok[1]
        if self.keyword("in"):
            values = [self.value()]
            while self.punct(","):
                values.append(self.value())
            return Compare(field, "in", tuple(values))
        op = self.peek()
        if op is None or op[0] != "op":
            raise self.fail(f"an operator ({' '.join(OPS)} or in) after '{field}'")
        self.i += 1
        return Compare(field, op[1], (self.value(),))


def parse(text: str | None) -> Node:
    """The filter for ``text`` (empty or None: everything matches); FilterError if invalid."""
    if text is None or not text.strip():
        return MatchAll()
    if not isinstance(text, str):
        raise FilterError("a filter must be a string")
    if len(text) > MAX_LENGTH:
        raise FilterError(f"filter is longer than {MAX_LENGTH} characters")
    p = _Parser(text)
    node = p.expr(0)
    if p.peek() is not None:
        raise p.fail("'and', 'or' or the end")
    return node


def check_fields(node: Node, known: set[str]) -> None:
    """FilterError naming the fields a filter reads that no observed tuple has."""
    unknown = sorted(fields_of(node) - known - set(META_FIELDS))
    if unknown:
        names = ", ".join(sorted(known)) or "none"
        raise FilterError(
            f"unknown field(s) {', '.join(unknown)}: the tuples have {names} "
            f"(and {', '.join(META_FIELDS)})"
        )
