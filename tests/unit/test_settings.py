"""Settings are declared once: the docs tables and the Ryu options come from the dataclasses."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest

from controller.autoscaling.autoscaler import ScaleSettings
from controller.debugging.debugger import Limits
from controller.load_balancing.balancer import LbSettings
from controller.locality.job import RouterSettings
from controller.recovery.fault_detector import FaultSettings
from controller.settings import CoreSettings, docs_table, from_section, options, setting

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = [CoreSettings, ScaleSettings, LbSettings, Limits, FaultSettings, RouterSettings]
MARKER = re.compile(r"^<!-- settings: (\w+) -->\n((?:\|.*\n?)+)", re.M)


def marked_tables() -> dict[str, list[tuple[str, str]]]:
    """section -> [(doc file, the table after its marker)]"""
    found: dict[str, list[tuple[str, str]]] = {}
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for m in MARKER.finditer(doc.read_text()):
            found.setdefault(m[1], []).append((doc.name, m[2].rstrip("\n")))
    return found


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.section)
def test_docs_table_is_the_dataclass(cls):
    tables = marked_tables().get(cls.section, [])
    assert len(tables) == 1, f"[{cls.section}]: want one marked table in docs/, found {tables}"
    doc, table = tables[0]
    assert table == docs_table(cls), f"docs/{doc}: regenerate with docs_table({cls.__name__})"


def test_every_marked_table_has_a_dataclass():
    assert set(marked_tables()) == {cls.section for cls in SETTINGS}


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.section)
def test_defaults_read_back_are_the_dataclass_defaults(cls):
    # what Ryu holds before any config file: each option's default, as the option kind stores it
    section = SimpleNamespace(
        **{o.name: list(o.default) if o.kind == "list" else o.default for o in options(cls)}
    )
    assert from_section(cls, section) == cls()


def test_option_names_kinds_and_list_cleanup():
    opts = {o.name: o for o in options(ScaleSettings)}
    assert opts["up_window"].field == "up_window_s" and opts["up_window"].kind == "float"
    assert opts["nodes"].kind == "list" and opts["recommend_only"].kind == "bool"
    assert "stale_s" not in {o.field for o in opts.values()}  # internal: no option
    values = {o.name: o.default for o in opts.values()}
    parsed = from_section(ScaleSettings, SimpleNamespace(**{**values, "nodes": [" a", "", "b "]}))
    assert parsed.nodes == ("a", "b")


def test_a_field_of_unknown_type_is_refused():
    @dataclass(frozen=True)
    class Bad:
        section: ClassVar[str] = "bad"
        ratio: complex = setting(1j, "no option kind for this")

    with pytest.raises(TypeError, match="ratio"):
        options(Bad)
