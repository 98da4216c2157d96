"""Each app's settings, declared once.

A settings class is a frozen dataclass whose fields are made with
:func:`setting`: the default, the help text and, when it differs from the
field, the name of the option in the Ryu config file.  Everything else is
derived from it, so the three cannot drift apart:

* the Ryu options of its ``[section]`` (``controller/app_support.py``
  ``register_settings``), and the instance read back from them;
* the table in the docs (``docs_table``; ``tests/unit/test_settings.py``
  checks that every ``<!-- settings: SECTION -->`` table in ``docs/`` is it).

Fields made without :func:`setting` are internal: no option, no row.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

# the Python type of a field -> the kind of option (controller/app_support.py maps it to cfg)
KINDS = {float: "float", int: "int", bool: "bool", str: "str", tuple[str, ...]: "list"}


@dataclass(frozen=True)
class Option:
    """One config-file option of a settings class."""

    field: str  # the dataclass field it fills
    name: str  # the option's name in the section
    kind: str  # float, int, bool, str or list (comma-separated strings)
    default: Any
    help: str
    shown: str  # the default as the docs show it


def setting(default: Any, help: str, *, name: str | None = None, shown: str | None = None) -> Any:
    """A dataclass field that is also an option (``name`` defaults to the field's)."""
    return dataclasses.field(default=default, metadata={"help": help, "name": name, "shown": shown})


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def options(cls: type) -> list[Option]:
    """The options of a settings class, in field order."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            continue
        kind = KINDS.get(hints[f.name])
        if kind is None:
            raise TypeError(f"{cls.__name__}.{f.name}: no option kind for {hints[f.name]}")
        shown = f.metadata["shown"]
        found.append(
            Option(
                field=f.name,
                name=f.metadata["name"] or f.name,
                kind=kind,
                default=f.default,
                help=f.metadata["help"],
                shown=_shown(f.default) if shown is None else shown,
            )
        )
    return found


def from_section(cls: type, section: Any) -> Any:
    """An instance of ``cls`` from a parsed section (anything with the options as
    attributes); list options drop blank entries."""
    values = {}
    for o in options(cls):
        value = getattr(section, o.name)
        if o.kind == "list":
            value = tuple(v.strip() for v in value if v.strip())
        values[o.field] = value
    return cls(**values)


def docs_table(cls: type) -> str:
    """The markdown table of the options, as ``docs/*.md`` show it."""
    rows = ["| option | default | meaning |", "|---|---|---|"]
    rows += [f"| `{o.name}` | {o.shown} | {o.help} |" for o in options(cls)]
    return "\n".join(rows)


@dataclass(frozen=True)
class CoreSettings:
    """The ``[typhoon]`` section: the controller core's own settings."""

    section: ClassVar[str] = "typhoon"

    coordinator: str = setting("", "coordinator URL or SQLite path", shown="(none)")
    poll_interval: float = setting(0.05, "seconds between coordinator reads")
    metrics_interval: float = setting(1.0, "seconds between METRIC_REQ rounds")
    api_token: str = setting(
        "", "token required by REST requests that change something", shown="(none)"
    )
    read_token: str = setting(
        "",
        "token every GET (and /metrics) needs, as X-Typhoon-Token or Authorization: Bearer; "
        "empty: reading is open",
        shown="(none)",
    )
    reconfig_step_timeout: float = setting(30.0, "seconds a reconfiguration step may take")
