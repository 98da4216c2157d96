"""Layers import downward only (docs/style.md): checked on the source, not by convention.

The shared core (wire format, topology, runtime, coordinator, ...) imports none
of controller/, apps/, mininet_env/, pyspark_bridge/, benchmarks/; controller/
and apps/ never import mininet_env/ or pyspark_bridge/.  ``typhoon_cli/`` is the
top layer that composes everything: it may import any package, and no package
imports it.  No file is exempt.

Inside controller/ and typhoon/, no module imports itself back: the graph of all
their imports has no cycle.  Every import counts: the top level, ``if TYPE_CHECKING:``
blocks (a type-only loop is still a loop to a reader) and function bodies (an import
deferred into a function only hides the loop from Python at load time, not from a
reader, and it is how loops came back).

``controller/`` has rooms: ``controller/rules/`` computes what a switch should hold
in pure Python and imports nothing else of ``controller/`` and no Ryu or os-ken;
``controller/framework/`` (the Ryu/os-ken boundary) imports nothing else of
``controller/`` either (no arrow back up from a room to the glue that uses it).
Each app's policy is a room too (``load_balancing/``, ``autoscaling/``, ``locality/``,
``debugging/``, ``recovery/``): it may use the two rooms below and the few shared
modules it names (its settings, the task runner, the REST conventions), never the
core, its services or another app's room; only the debugger's REST routes touch Ryu.

Inside ``typhoon/`` the subpackages and top-level modules have layers too
(:data:`TYPHOON_LAYERS`): the wire format below all, then the host utilities, the
operators, the topology, what reads a topology (checkpoints, locality, coordinator,
reconfiguration plans), the worker runtime, and on top what starts and runs jobs.  A
module imports its own layer or a lower one, never a higher; every part of ``typhoon/``
has a layer, so a new module is placed on purpose.

``typhoon/wire/`` is below everything: it imports nothing of the project outside
itself, so a wire change (one edit of ``typhoon/wire/header.py``) stays in its room.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = "typhoon_cli"
RULES = {
    "typhoon": {"controller", "apps", "mininet_env", "pyspark_bridge", "benchmarks", TOP},
    "controller": {"apps", "mininet_env", "pyspark_bridge", "benchmarks", TOP},
    "apps": {"mininet_env", "pyspark_bridge", "benchmarks", TOP},
    "pyspark_bridge": {"controller", "apps", "mininet_env", "benchmarks", TOP},
    "mininet_env": {"benchmarks", TOP},
    "benchmarks": {TOP},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


CASES = [(pkg, path) for pkg in RULES for path in sorted((ROOT / pkg).rglob("*.py"))]


@pytest.mark.parametrize(("pkg", "path"), CASES, ids=[str(p.relative_to(ROOT)) for _, p in CASES])
def test_imports_go_downward(pkg, path):
    bad = imported_packages(path) & RULES[pkg]
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


FRAMEWORKS = {"ryu", "os_ken", "eventlet", "webob"}
# controller/'s rooms that must not import the rest of controller/ (no arrow back up),
# and whether the room may import a framework.  controller/rules/ computes what a
# switch should hold in pure Python; controller/framework/ is the Ryu/os-ken boundary.
ROOMS = {"rules": False, "framework": True}
# Each app's policy room: the parts of controller/ outside it that it may import
# (the rooms below it and the shared modules named), and whether it may import a
# framework.  The core (core.py, core_recovery.py, services.py) and the app shells
# (apps/) import these rooms, never the reverse.
APP_ROOMS: dict[str, tuple[bool, frozenset[str]]] = {
    "load_balancing": (False, frozenset({"rules", "settings"})),
    "autoscaling": (False, frozenset({"settings"})),
    "locality": (False, frozenset({"settings"})),
    "recovery": (False, frozenset({"rules", "settings", "waits"})),
    # debug_rest.py: the debugger's routes on the core's REST conventions (rest.py)
    "debugging": (True, frozenset({"rules", "framework", "settings", "rest"})),
}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it (``from a import b`` gives ``a`` and
    ``a.b``; a relative one keeps its dots)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            dots = "." * node.level
            if node.module:
                found.add(dots + node.module)
            prefix = f"{dots}{node.module}." if node.module else dots
            found.update(prefix + a.name for a in node.names)
    return found


def room_offences(
    path: Path, room: str, framework_ok: bool, may_use: frozenset[str] = frozenset()
) -> list[str]:
    """What a module of ``controller/<room>/`` must not import: a relative name (so the
    check cannot be dodged), any part of ``controller/`` outside its room and the parts
    it ``may_use``, and (unless the room is allowed a framework) Ryu/os-ken/eventlet/webob."""
    bad = []
    for name in sorted(imported_modules(path)):
        part = name.partition(".")[2].split(".")[0]
        if name.startswith("."):
            bad.append(f"{name} (relative: name the module)")
        elif name.split(".")[0] in FRAMEWORKS and not framework_ok:
            bad.append(name)
        elif name.split(".")[0] == "controller" and part != room and part not in may_use:
            bad.append(name)
    return bad


def room_rules() -> dict[str, tuple[bool, frozenset[str]]]:
    return {**{room: (ok, frozenset()) for room, ok in ROOMS.items()}, **APP_ROOMS}


ROOM_CASES = [
    (room, path)
    for room in room_rules()
    for path in sorted((ROOT / "controller" / room).rglob("*.py"))
]


@pytest.mark.parametrize(
    ("room", "path"), ROOM_CASES, ids=[str(p.relative_to(ROOT)) for _, p in ROOM_CASES]
)
def test_a_room_imports_nothing_of_controller_above_it(room, path):
    framework_ok, may_use = room_rules()[room]
    bad = room_offences(path, room, framework_ok, may_use)
    assert not bad, f"{path.relative_to(ROOT)}: {bad}"


def test_every_package_of_controller_is_a_known_room():
    folders = {p.parent.name for p in (ROOT / "controller").glob("*/*.py")}
    assert folders == set(room_rules()), "a new room of controller/ needs its rule here"


def test_the_rooms_hold_the_rule_compilers_and_the_boundary():
    names = {(room, p.stem) for room, p in ROOM_CASES}
    rules = {"flows", "groups", "meters", "mirror", "cookies", "composer", "reconcile"}
    assert {("rules", n) for n in rules} <= names
    assert {("framework", n) for n in ("ryu_compat", "osken_wsgi", "backend")} <= names


def test_each_app_policy_lives_in_its_room():
    names = {(room, p.stem) for room, p in ROOM_CASES}
    assert {
        ("load_balancing", "balancer"),
        ("load_balancing", "senders"),
        ("autoscaling", "autoscaler"),
        ("locality", "router"),
        ("locality", "job"),
        ("debugging", "debugger"),
        ("recovery", "fault_detector"),
        ("recovery", "fault_detector_machine"),
    } <= names
    flat = {p.stem for p in (ROOT / "controller").glob("*.py")}
    assert not flat & {"load_balancer", "autoscaler", "locality", "debugger", "fault_detector"}


def test_the_room_check_sees_glue_framework_and_relative_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "from controller.rules.flows import RuleSpec\n"
        "from controller.ofp import flow_mod\n"
        "from controller import core\n"
        "from controller.rules import cookies\n"
        "def f():\n    import os_ken.cfg\n"
        "from . import cookies\n"
    )
    assert room_offences(f, "rules", framework_ok=False) == [
        ".cookies (relative: name the module)",
        "controller",
        "controller.core",
        "controller.ofp",
        "controller.ofp.flow_mod",
        "os_ken.cfg",
    ]
    assert room_offences(f, "framework", True, frozenset({"rules", "ofp"})) == [
        ".cookies (relative: name the module)",
        "controller",
        "controller.core",
    ]
    assert room_offences(f, "framework", framework_ok=True) == [
        ".cookies (relative: name the module)",
        "controller",
        "controller.core",
        "controller.ofp",
        "controller.ofp.flow_mod",
        "controller.rules",
        "controller.rules.cookies",
        "controller.rules.flows",
        "controller.rules.flows.RuleSpec",
    ]


CYCLE_PACKAGES = ("controller", "typhoon", "typhoon_cli")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import of a module: its top level, ``if`` blocks and function bodies."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def import_graph(root: Path, packages: tuple[str, ...]) -> nx.DiGraph:
    """Module -> the modules of ``packages`` it imports anywhere (``from a import b``
    names ``a.b`` if that is a module, else ``a``)."""
    paths = {module_name(root, p): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in paths.items():
        graph.add_node(name)
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in all_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph.add_edge(name, target)
    return graph


def test_no_import_cycle_in_controller_typhoon_or_the_cli():
    graph = import_graph(ROOT, CYCLE_PACKAGES)
    assert graph.number_of_nodes() > 100  # it did read the packages
    cycles = sorted(" -> ".join(c) for c in nx.simple_cycles(graph))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_check_sees_a_type_only_loop_and_a_deferred_one(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "machine.py").write_text("from pkg.recovery import Recovery\n")
    (pkg / "recovery.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.machine import Core\n"
    )
    (pkg / "later.py").write_text("from . import machine\ndef f():\n    from pkg import later2\n")
    (pkg / "later2.py").write_text("class C:\n    def g(self):\n        import pkg.later\n")
    (pkg / "alone.py").write_text("def f():\n    from pkg import machine\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert sorted(sorted(c) for c in nx.simple_cycles(graph)) == [
        ["pkg.later", "pkg.later2"],
        ["pkg.machine", "pkg.recovery"],
    ]
    assert graph.has_edge("pkg.later", "pkg.machine") and graph.has_edge("pkg.alone", "pkg.machine")


# typhoon/'s layers, lowest first: a part (subpackage or top-level module, "__init__" for
# the package's own) imports parts of its own layer or lower ones.  The order is the
# import graph's (no part imports one listed above it); what stands where and why:
TYPHOON_LAYERS: list[tuple[str, set[str]]] = [
    ("wire format", {"wire"}),  # imports nothing else of typhoon/
    (
        "host and process utilities",
        {
            "__init__",
            "cluster",
            "private_files",
            "logs",
            "supervised",
            "client",
            "tcp_jobs",  # where a running tcp job's control endpoint is, by its name
            "live",
            "ovs_bridge",
            "ovs_malloc",  # how ovs-vswitchd's allocator must be started (setup.sh)
            "dissect",
            "cluster_file",
            "bridge_plan",
            "fabric_guard",
            "sink_rates",  # pure: how fast sinks went before and after an incident
            "zygote_protocol",  # the launcher <-> worker fork server messages
            "zygote",  # the launcher's side of the fork server
        },
    ),
    ("operators", {"operators"}),  # what a node runs; the loader resolves them
    ("topology", {"topology"}),  # the file, the model, the scheduler, the config keys
    (
        "what reads a topology",
        {"checkpoint", "locality", "coordinator", "engines", "report", "reconfig"},
    ),
    ("worker runtime", {"runtime"}),
    (
        "starting and running jobs",
        {
            "manager",
            "assignments",
            "job_report",
            "engine_services",
            "worker_specs",
            "port_budgets",
            "control_queue",
            "host_setup",
            "debug",
            "agent",
            "agent_launcher",  # an agent's workers: forked from its zygote, else spawned
            "tcp_cluster",
            "tcp_control",  # a running tcp job's endpoint for the CLI's update verbs
            "tcp_options",
            "tcp_gate",
            "tcp_reconfig",
            "tcp_requests",
            "tcp_recovery",
            "tcp_report",
        },
    ),
]


def part_of(module: str) -> str:
    """``typhoon.topology.loader`` -> ``topology``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: nx.DiGraph, layers: list[tuple[str, set[str]]]) -> list[str]:
    """Every import of a module from a part in a higher layer than its own."""
    level = {part: i for i, (_, parts) in enumerate(layers) for part in parts}
    return sorted(
        f"{a} -> {b} ({layers[level[part_of(a)]][0]} imports {layers[level[part_of(b)]][0]})"
        for a, b in graph.edges
        if level[part_of(b)] > level[part_of(a)]
    )


def test_every_part_of_typhoon_has_one_layer():
    graph = import_graph(ROOT, ("typhoon",))
    parts = {part_of(m) for m in graph}
    listed = [part for _, layer in TYPHOON_LAYERS for part in layer]
    assert len(listed) == len(set(listed)), "a part is in two layers"
    assert parts == set(listed), (
        f"without a layer: {sorted(parts - set(listed))}; "
        f"listed but gone: {sorted(set(listed) - parts)}"
    )


def test_typhoon_imports_go_down_its_layers():
    graph = import_graph(ROOT, ("typhoon",))
    assert graph.number_of_edges() > 200  # it did read the imports
    bad = upward_imports(graph, TYPHOON_LAYERS)
    assert not bad, "upward imports inside typhoon/:\n" + "\n".join(bad)


def test_the_layer_check_sees_an_import_from_above(tmp_path):
    pkg = tmp_path / "typhoon"
    (pkg / "topology").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "topology" / "__init__.py").write_text("")
    (pkg / "topology" / "budgets.py").write_text(
        "from typhoon.wire import frames\ndef f():\n    from typhoon.runtime import tap\n"
    )
    (pkg / "runtime.py").write_text("from typhoon.topology import budgets\n")
    (pkg / "wire.py").write_text("")
    layers = [("wire", {"wire", "__init__"}), ("topology", {"topology"}), ("rt", {"runtime"})]
    graph = import_graph(tmp_path, ("typhoon",))
    assert upward_imports(graph, layers) == [
        "typhoon.topology.budgets -> typhoon.runtime (topology imports rt)"
    ]


WIRE = ROOT / "typhoon" / "wire"


def wire_offences(path: Path) -> list[str]:
    """What a module of ``typhoon/wire/`` imports of the project outside ``typhoon.wire``
    (anywhere in it), or relatively: the wire format is the bottom layer, which every
    other part (runtime, control queue, dissector, controller) reads."""
    bad = []
    for name in sorted(imported_modules(path)):
        if name.startswith("."):
            bad.append(f"{name} (relative: name the module)")
        elif name.split(".")[0] in RULES and name.split(".")[0] != "typhoon":
            bad.append(name)
        elif name.startswith("typhoon.") and not name.startswith("typhoon.wire"):
            bad.append(name)
    return bad


WIRE_CASES = sorted(WIRE.rglob("*.py"))


@pytest.mark.parametrize("path", WIRE_CASES, ids=[str(p.relative_to(ROOT)) for p in WIRE_CASES])
def test_the_wire_format_imports_nothing_above_it(path):
    bad = wire_offences(path)
    assert not bad, f"{path.relative_to(ROOT)}: {bad}"


def test_the_wire_check_sees_the_rest_of_typhoon(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "from typhoon.wire.header import LAYOUT\n"
        "from typhoon import wire, topology\n"
        "def f():\n    from typhoon.runtime import links\n"
        "import controller.rules.flows\n"
        "from .checks import U16_MAX\n"
    )
    assert wire_offences(f) == [
        ".checks (relative: name the module)",
        ".checks.U16_MAX (relative: name the module)",
        "controller.rules.flows",
        "typhoon.runtime",
        "typhoon.runtime.links",
        "typhoon.topology",
    ]
    assert {p.stem for p in WIRE_CASES} >= {"header", "frames", "__init__"}
