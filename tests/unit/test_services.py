"""Apps reach the core only through controller/services.py: checked over their source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APPS = Path(__file__).resolve().parents[2] / "apps"
# the core's state: apps ask controller/services.py instead
CORE_FIELDS = {
    "datapaths", "installed", "installed_groups", "desired_groups", "desired_rules", "port_up",
    "coordinator", "manager", "reconfigs", "progress", "sync", "channel", "composer", "_core",
}  # fmt: skip
# expressions that stand for the core (or its services) in an app
CORE_NAMES = {"core", "core_app", "services"}


def _is_core(node: ast.AST) -> bool:
    """``core``, ``core()``, ``self.core()``, ``services()``, ``self.core``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id in CORE_NAMES
    return isinstance(node, ast.Attribute) and node.attr in CORE_NAMES


def problems(source: str) -> list[str]:
    """Where an app's source reaches past the service API."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "controller.core":
            found.append(f"line {node.lineno}: imports controller.core")
        elif isinstance(node, ast.Import) and any(a.name == "controller.core" for a in node.names):
            found.append(f"line {node.lineno}: imports controller.core")
        elif isinstance(node, ast.Name) and node.id in ("lookup_service_brick", "core_app"):
            found.append(f"line {node.lineno}: looks the core up by itself ({node.id})")
        elif isinstance(node, ast.Attribute) and node.attr == "_core":
            found.append(f"line {node.lineno}: reads the services' core")
        elif isinstance(node, ast.Attribute) and node.attr in CORE_FIELDS and _is_core(node.value):
            found.append(f"line {node.lineno}: reads the core's {node.attr}")
    return found


@pytest.mark.parametrize("path", sorted(APPS.glob("*.py")), ids=lambda p: p.name)
def test_no_app_reads_a_core_field(path: Path):
    assert problems(path.read_text()) == []


@pytest.mark.parametrize(
    "source, what",
    [
        ("from controller.core import core_app\n", "imports controller.core"),
        ("import controller.core\n", "imports controller.core"),
        ("x = core.datapaths\n", "reads the core's datapaths"),
        ("x = self.core().installed_groups.get(1)\n", "reads the core's installed_groups"),
        ("core.coordinator.get_agent('h1')\n", "reads the core's coordinator"),
        ("services().manager.placement('a')\n", "reads the core's manager"),
        ("x = self.core()._core\n", "reads the services' core"),
        ("app = lookup_service_brick('TyphoonController')\n", "looks the core up by itself"),
    ],
)
def test_the_check_catches_each_way_past_the_services(source: str, what: str):
    assert any(what in p for p in problems(source)), problems(source)


def test_an_apps_own_fields_of_those_names_are_fine():
    # the load balancer's per-worker state has a port_up of its own
    assert problems("nb.worker(3).port_up = False\nself.progress = {}\n") == []
