"""A topology file up to its shape: YAML with line marks, ${ENV} values, the schema.

This layer knows text and structure only; operators, references, fields and
cycles are the loader's job.  ``yaml.compose`` gives the line of every key and
list item, so any later problem can point at its line.  jsonschema checks the
structure, but its messages quote Python reprs, so :func:`first_problem`
rewrites each error as one sentence that names the node or stream it is
about, and reports the one that comes first in the file.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from .config import NodeConfig, TopologyConfig, config_schema
from .model import ENGINES

Path = tuple[Any, ...]  # keys and list indexes from the document root


class TopologyError(Exception):
    """A topology file that cannot be used; ``str()`` is ``file:line: sentence``."""

    def __init__(self, file: str, line: int, message: str) -> None:
        self.file, self.line, self.message = file, line, message
        super().__init__(f"{file}:{line}: {message}" if line else f"{file}: {message}")

    def __reduce__(self) -> tuple[type, tuple[str, int, str]]:
        return (type(self), (self.file, self.line, self.message))  # survives pickling


@dataclass
class Document:
    """A structurally valid topology file: plain data plus the line of every element."""

    filename: str
    data: dict[str, Any]
    lines: dict[Path, int]

    def line(self, path: Path) -> int:
        """Line of ``path``, or of its nearest ancestor that has one."""
        while path not in self.lines:
            path = path[:-1]
        return self.lines[path]

    def fail(self, path: Path, message: str) -> TopologyError:
        return TopologyError(self.filename, self.line(path), message)


EnvMode = Literal["expand", "keep", "refuse"]


def read_document(text: str, filename: str, env: EnvMode = "expand") -> Document:
    """Parse YAML text and check it against :data:`SCHEMA`; the first problem raises.

    ``env`` says what ``${NAME}`` does: ``expand`` from this process's
    environment (a local file), ``refuse`` (a file sent to the controller: its
    environment is not the submitter's, and node args are shown to readers) or
    ``keep`` the text as it is (a document that is data, such as a running
    topology being reconfigured).
    """
    data, marks = _parse_marked(text, filename, env)
    document = Document(filename, data, marks.lines)
    problem = first_problem(data, document.line)
    if problem:
        raise TopologyError(filename, *problem)
    return document


ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"

_NODE = {
    "type": "object",
    "required": ["id"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "pattern": ID_PATTERN},
        "operator": {"type": "string", "minLength": 1},
        "className": {"type": "string", "minLength": 1},  # Flux's name for `operator`
        "args": {"type": ["object", "null"]},
        "parallelism": {"type": "integer", "minimum": 1},
        "engine": {"type": "string", "enum": list(ENGINES)},
        "stateful": {"type": "boolean"},
        # a spout's event-time watermarks (typhoon/runtime/watermarks.py, docs/windows.md)
        "watermark": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "time_field": {"type": "string", "minLength": 1},
                "out_of_order_ms": {"type": "number", "minimum": 0},
                "clock": {"type": "string", "enum": ["event", "processing"]},
                "idle_timeout_ms": {"type": "number", "exclusiveMinimum": 0},
                "interval_ms": {"type": "number", "exclusiveMinimum": 0},
            },
        },
        # a node's own settings, declared in typhoon/topology/config.py
        "config": config_schema(NodeConfig),
    },
}

_FIELD_LIST = {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}

_GROUPING = {
    # a string shorthand ("shuffle") or a mapping; object keywords ignore strings
    "type": ["string", "object"],
    "minLength": 1,
    "required": ["type"],
    "additionalProperties": False,
    "properties": {
        "type": {"type": "string", "minLength": 1},
        "fields": _FIELD_LIST,
        "args": _FIELD_LIST,  # Flux's name for `fields`
        "table": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
        "streamId": {"type": "string", "minLength": 1},  # Flux's place for the stream name
    },
}

_STREAM = {
    "type": "object",
    "required": ["from", "to", "grouping"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},  # Flux: a free label, ignored
        "from": {"type": "string", "minLength": 1},
        "to": {"type": "string", "minLength": 1},
        "stream": {"type": "string", "minLength": 1},
        "grouping": _GROUPING,
        # the rows' layout, field -> type (typhoon.wire.layout.TYPES; the loader checks both)
        "columns": {"type": "object", "minProperties": 1},
    },
}

# Every key the code reads from a topology's `config` is declared in
# typhoon/topology/config.py; `spark.*` settings go to the Spark engine as they are.
# A key not declared there is a typo until someone adds it.
_CONFIG = config_schema(TopologyConfig)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "spouts"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": ID_PATTERN},
        "config": _CONFIG,
        "spouts": {"type": "array", "minItems": 1, "items": _NODE},
        "bolts": {"type": ["array", "null"], "items": _NODE},
        "streams": {"type": ["array", "null"], "items": _STREAM},
    },
}


def _is_int(_checker: Any, value: Any) -> bool:
    # JSON Schema calls 2.0 an integer and jsonschema already excludes bools;
    # a parallelism of 2.0 in YAML is still a typo we want to report.
    return isinstance(value, int) and not isinstance(value, bool)


@functools.cache
def _validator() -> Any:
    """The schema's validator, built on first use: jsonschema takes ~70 ms to import, and
    every worker imports this package (for the model) without ever checking a file."""
    from jsonschema import Draft202012Validator, validators

    extended = validators.extend(
        Draft202012Validator,
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_int),
    )
    return extended(SCHEMA)


_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "empty",
}


def show(value: Any) -> str:
    """Name a YAML value the way a user wrote it, not as a Python repr."""
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return str(value)


def describe(doc: Any, path: Path) -> str:
    """Say which element ``path`` is in: "bolt 'split'", "stream 2", "the topology"."""
    if len(path) >= 2 and path[0] in ("spouts", "bolts"):
        item = _get(doc, path[:2])
        kind = "spout" if path[0] == "spouts" else "bolt"
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            return f"{kind} '{item['id']}'"
        return f"{kind} {path[1] + 1}"
    if len(path) >= 2 and path[0] == "streams":
        item = _get(doc, path[:2])
        if isinstance(item, dict) and isinstance(item.get("from"), str):
            if isinstance(item.get("to"), str):
                return f"stream '{item['from']}' -> '{item['to']}'"
        return f"stream {path[1] + 1}"
    return "the topology"


def _get(doc: Any, path: Path) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def _subject(doc: Any, path: Path) -> str:
    """What an error is about: "'parallelism' of bolt 'split'", or "bolt 2" itself."""
    element = len(path) >= 2 and path[0] in ("spouts", "bolts", "streams")
    rest = path[2:] if element else path
    text = ""
    for step in rest:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else str(step))
    where = describe(doc, path)
    return f"'{text}' of {where}" if text else where


def _sentence(doc: Any, err: Any) -> tuple[Path, str]:
    """Turn one jsonschema error into (path of the offending element, sentence)."""
    path: Path = tuple(err.absolute_path)
    where = describe(doc, path)
    subject = _subject(doc, path)
    value = err.instance
    kind = err.validator
    if kind == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        patterns = list(err.schema.get("patternProperties", {}))
        extra = [
            k for k in value if k not in allowed and not any(re.search(p, str(k)) for p in patterns)
        ][0]
        close = difflib.get_close_matches(str(extra), allowed, n=1)
        inside = _config_keys_path(path)
        if inside is not None:  # a key of a topology's or node's `config`, or nested in one
            name = ".".join([*inside, str(extra)])
            if close:
                hint = f"; did you mean '{'.'.join([*inside, close[0]])}'?"
            else:
                spark = ", and spark.* settings" if path == ("config",) else ""
                hint = f" (known keys: {', '.join(allowed)}{spark})"
            place = "" if path[0] == "config" else f" in {where}"
            return path + (extra,), f"unknown config key '{name}'{place}{hint}"
        hint = f"; did you mean '{close[0]}'?" if close else f" (expected: {', '.join(allowed)})"
        place = "at top level" if where == "the topology" and not path else f"in {where}"
        if path and path[-1] == "grouping":
            place = f"in the grouping of {where}"
        return path + (extra,), f"unknown key '{extra}' {place}{hint}"
    if kind == "required":
        missing = [k for k in err.validator_value if k not in value][0]
        return path, f"{where} is missing '{missing}'"
    if path and path[-1] == "parallelism":
        return path, f"'parallelism' of {where} must be an integer >= 1, not {show(value)}"
    if kind == "type":
        expected = err.validator_value
        expected = [expected] if isinstance(expected, str) else expected
        words = " or ".join(_TYPE_WORDS[t] for t in expected if t != "null")
        return path, f"{subject} must be {words}, not {show(value)}"
    if kind == "enum":
        choices = ", ".join(err.validator_value)
        return path, f"{subject} must be one of {choices}, not {show(value)}"
    if kind == "minimum":
        return path, f"{subject} must be at least {err.validator_value}, not {show(value)}"
    if kind == "exclusiveMinimum":
        return path, f"{subject} must be greater than {err.validator_value}, not {show(value)}"
    if kind == "minItems" and path == ("spouts",):
        return path, "'spouts' must list at least one spout"
    if kind in ("minItems", "minLength"):
        return path, f"{subject} must not be empty"
    if kind == "pattern":
        what = "topology name" if path == ("name",) else f"{where.split()[0]} id"
        return path, f"{what} {show(value)} may only contain letters, digits, '_', '-' and '.'"
    return path, f"{subject}: {err.message}"


def _config_keys_path(path: Path) -> list[str] | None:
    """The keys below ``config`` of a path into a topology's or a node's ``config``
    (``[]`` for the mapping itself, ``["sdn"]`` inside ``config.sdn``), else None."""
    if path[:1] == ("config",):
        return [str(step) for step in path[1:]]
    if len(path) >= 3 and path[0] in ("spouts", "bolts") and path[2] == "config":
        return [str(step) for step in path[3:]]
    return None


def first_problem(doc: Any, line_of: Callable[[Path], int]) -> tuple[int, str] | None:
    """Check ``doc`` against :data:`SCHEMA`; return (line, sentence) of the earliest problem."""
    problems = [_sentence(doc, e) for e in _validator().iter_errors(doc)]
    if not problems:
        return None
    path, message = min(problems, key=lambda p: line_of(p[0]))
    return line_of(path), message


# --- YAML: marks, duplicate keys, ${ENV} substitution ----------------------------------

_ENV = re.compile(r"\$\{(?:ENV-)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_NULL_TAG = "tag:yaml.org,2002:null"


def expand_environment(text: str, filename: str) -> str:
    """The file with every ``${NAME}`` substituted from this process's environment.

    ``typhoon submit`` sends this to the controller, which substitutes nothing.
    A file without substitutions comes back unchanged (so the controller's
    error lines match the file); otherwise as the YAML of the expanded data.
    """
    data, marks = _parse_marked(text, filename, "expand")
    return yaml.safe_dump(data, sort_keys=False) if marks.substituted else text


def _parse_marked(text: str, filename: str, env: EnvMode) -> tuple[Any, _Marks]:
    """YAML text -> (plain data, the walk that knows every key's and list item's line)."""
    try:  # the reader checks the characters as it is made
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as e:
        raise TopologyError(filename, 1, f"YAML syntax: {e}") from e
    try:
        root = loader.get_single_node()
        if root is None:
            raise TopologyError(
                filename, 1, "the file is empty; a topology needs 'name' and 'spouts'"
            )
        marks = _Marks(filename, loader, env)
        marks.walk(root)
        doc = loader.construct_document(root)
    except yaml.MarkedYAMLError as e:
        raise TopologyError(filename, *_yaml_problem(e)) from e
    except yaml.YAMLError as e:
        raise TopologyError(filename, 1, f"YAML syntax: {e}") from e
    finally:
        loader.dispose()
    if not isinstance(doc, dict):
        kind = {list: "a list", str: "a string"}.get(type(doc), "a single value")
        raise TopologyError(
            filename, 1, f"a topology file must be a mapping with 'name' and 'spouts', not {kind}"
        )
    return doc, marks


def _yaml_problem(e: yaml.MarkedYAMLError) -> tuple[int, str]:
    """(line, sentence) from PyYAML's problem/context pair, at the line PyYAML reports."""
    mark = e.problem_mark or e.context_mark
    line = mark.line + 1 if mark else 1
    problem, context = e.problem or "", e.context or ""
    if problem.startswith("but ") and context:  # "expected X" + "but found Y"
        return line, f"YAML syntax: {context} {problem}"
    text = f"YAML syntax: {problem or context or 'unreadable YAML'}"
    if problem and context and e.context_mark and e.context_mark.line + 1 != line:
        text += f" ({context} from line {e.context_mark.line + 1})"
    return line, text


class _Marks:
    """One pass over the composed YAML: lines, duplicate keys, ${ENV} substitution."""

    def __init__(self, filename: str, loader: yaml.SafeLoader, env: EnvMode) -> None:
        self.filename, self.loader, self.env = filename, loader, env
        self.substituted = False  # some ${NAME} was expanded
        self.lines: dict[Path, int] = {}
        self.open: set[int] = set()  # nodes on the current path: an alias back to one loops
        self.done: set[int] = set()  # nodes already visited through another alias

    def walk(self, root: yaml.Node) -> dict[Path, int]:
        self.lines[()] = root.start_mark.line + 1
        self._visit(root, ())
        return self.lines

    def _visit(self, node: yaml.Node, path: Path) -> None:
        if id(node) in self.open:
            raise TopologyError(self.filename, node.start_mark.line + 1, "recursive YAML alias")
        if id(node) in self.done:
            return
        self.open.add(id(node))
        if isinstance(node, yaml.MappingNode):
            self._mapping(node, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.lines[path + (i,)] = item.start_mark.line + 1
                self._visit(item, path + (i,))
        elif node.tag == _STR_TAG and "${" in node.value and self.env != "keep":
            self._substitute(node)
        self.open.discard(id(node))
        self.done.add(id(node))

    def _mapping(self, node: yaml.MappingNode, path: Path) -> None:
        seen: dict[str, int] = {}
        for key, value in node.value:
            if key.tag == _MERGE_TAG or not isinstance(key, yaml.ScalarNode):
                self._visit(value, path)  # merged keys: lines fall back to this mapping's
                continue
            if key.style is None and key.tag in (_BOOL_TAG, _NULL_TAG):
                key.tag = _STR_TAG  # YAML 1.1 reads `yes:`/`on:`/`null:` keys as bool/None
            line = key.start_mark.line + 1
            if key.value in seen:
                raise TopologyError(
                    self.filename,
                    line,
                    f"duplicate key '{key.value}' (first at line {seen[key.value]})",
                )
            seen[key.value] = line
            self.lines[path + (key.value,)] = line
            self._visit(value, path + (key.value,))

    def _substitute(self, node: yaml.ScalarNode) -> None:
        """Expand ${NAME}, ${NAME:-default} (and Flux's ${ENV-NAME}) from the environment.

        An unquoted value that is a single substitution takes the YAML type of
        what it expands to, so ``parallelism: ${PAR:-2}`` is the integer 2.
        """

        def expand(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise TopologyError(
                self.filename,
                node.start_mark.line + 1,
                f"environment variable '{name}' is not set "
                f"(write ${{{name}:-default}} to give a default)",
            )

        found = _ENV.search(node.value)
        if found is None:
            return
        if self.env == "refuse":
            raise TopologyError(
                self.filename,
                node.start_mark.line + 1,
                f"'{found.group(0)}': the controller does not substitute environment variables "
                "(`typhoon submit FILE` substitutes them from your environment before sending)",
            )
        self.substituted = True
        whole = _ENV.fullmatch(node.value) is not None
        node.value = _ENV.sub(expand, node.value)
        if whole and node.style is None:
            node.tag = self.loader.resolve(yaml.ScalarNode, node.value, (True, False))
