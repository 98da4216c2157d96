"""Batch size and max delay declared once (typhoon/topology/batching.py).

The rules of the one declaration (defaults, the older ``max_delay``, command line over
file over runner), and a scan of the code that fails when a default is written again
somewhere else, or the older key is read anywhere but there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import typhoon_cli
from benchmarks.testbed import RunSpec
from mininet_env.run import SdnRunOptions
from typhoon.runtime.spec import WorkerSpec
from typhoon.tcp_cluster import RunOptions
from typhoon.topology import load_topology_text
from typhoon.topology.batching import DEFAULTS, FIELDS, LEGACY_KEYS, Batching, override

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("typhoon", "typhoon_cli", "controller", "apps", "mininet_env", "benchmarks")
HOME = ROOT / "typhoon" / "topology" / "batching.py"
FLAGS = {"--" + name.replace("_", "-"): name for name in FIELDS}

PIPE = """
name: pipe
spouts:
  - {id: source, operator: sequence_source, args: {count: 10}}
bolts:
  - {id: sink, operator: sequence_check}
streams:
  - {from: source, to: sink, grouping: shuffle}
"""


# ----- the rules ----------------------------------------------------------------------------


def test_nothing_said_gives_the_defaults_and_a_fallback_where_it_is_silent():
    assert Batching.of(None) == Batching.of({}) == DEFAULTS
    assert Batching.of({"batch_size": 7}, Batching(50, 9.0)) == Batching(7, 9.0)
    assert Batching.of({}, Batching(50, 9.0)) == Batching(50, 9.0)


def test_the_older_key_counts_only_without_the_new_one():
    assert Batching.of({"max_delay": 7}).max_delay_ms == 7.0
    assert Batching.of({"max_delay": 7, "max_delay_ms": 1.5}).max_delay_ms == 1.5


def test_write_puts_both_under_their_current_names():
    config = {"max_delay": 7, "batch_size": 3, "sdn": {}}
    Batching.of(config).write(config)
    assert config == {"batch_size": 3, "max_delay_ms": 7.0, "sdn": {}}


def test_a_json_round_trip_keeps_the_batch_size_an_integer():
    got = Batching.of({"batch_size": 100.0})
    assert got.batch_size == 100 and isinstance(got.batch_size, int)


@pytest.mark.parametrize(
    "config",
    [{"batch_size": 0}, {"batch_size": True}, {"batch_size": 2.5}, {"batch_size": "10"}]
    + [{"max_delay_ms": -1}, {"max_delay": -0.5}, {"max_delay_ms": "2"}],
)
def test_bad_values_are_refused_with_the_key_named(config):
    with pytest.raises(ValueError, match="batch_size|max_delay_ms"):
        Batching.of(config)


def test_override_replaces_only_what_is_given_and_drops_the_older_key_it_replaces():
    config = {"batch_size": 50, "max_delay": 7}
    override(config, 10, None)
    assert config == {"batch_size": 10, "max_delay": 7}
    override(config, None, 0.0)
    assert config == {"batch_size": 10, "max_delay_ms": 0.0}
    with pytest.raises(ValueError):
        override(config, 0, None)
    assert config == {"batch_size": 10, "max_delay_ms": 0.0}  # a refused value changes nothing


def test_a_worker_spec_carries_the_settings_and_an_old_spec_file_gets_the_defaults():
    topo = load_topology_text(PIPE, "pipe")
    from typhoon.topology import schedule

    physical = schedule(topo, ["h1"], 1, first_port=0)
    spec = WorkerSpec(topo, physical, 0, batch_size=5, max_delay_ms=0.5)
    assert WorkerSpec.from_dict(spec.to_dict()) == spec
    old = spec.to_dict()
    del old["batch_size"], old["max_delay_ms"]
    back = WorkerSpec.from_dict(old)
    assert (back.batch_size, back.max_delay_ms) == (DEFAULTS.batch_size, DEFAULTS.max_delay_ms)


@pytest.mark.parametrize(
    "holder",
    [WorkerSpec.__dataclass_fields__, RunOptions(), SdnRunOptions(), RunSpec.__dataclass_fields__],
    ids=["WorkerSpec", "tcp RunOptions", "SdnRunOptions", "benchmarks RunSpec"],
)
def test_every_runner_starts_from_the_one_default(holder):
    for name in FIELDS:
        value = holder[name].default if isinstance(holder, dict) else getattr(holder, name)
        assert value == getattr(DEFAULTS, name), name


def test_the_command_line_help_states_the_default_in_force():
    run = next(
        a for a in typhoon_cli.build_parser()._subparsers._group_actions[0].choices.values()
        if a.prog.endswith(" run")
    )  # fmt: skip
    seen = {}
    for action in run._actions:
        for flag in action.option_strings:
            if flag in FLAGS:
                m = re.search(r"default ([0-9.]+)\)", action.help or "")
                assert m, f"{flag}'s help does not say its default: {action.help!r}"
                seen[FLAGS[flag]] = float(m.group(1))
                assert action.default is None  # not set: the file's config, then the runner's
    assert seen == {name: float(getattr(DEFAULTS, name)) for name in FIELDS}


# ----- no second copy -----------------------------------------------------------------------


def _number(node: ast.AST | None) -> float | None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    return None


def _key(node: ast.AST | None) -> str | None:
    """The setting a string constant or ``x["key"]`` names, if any."""
    if isinstance(node, ast.Subscript):
        node = node.slice
    if isinstance(node, ast.Constant) and node.value in FIELDS:
        return node.value
    return None


def copies(source: str) -> list[str]:
    """Where ``source`` writes a batching default again or reads the older key itself."""
    found: list[str] = []
    default = {name: getattr(DEFAULTS, name) for name in FIELDS}

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"line {node.lineno}: {what}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in LEGACY_KEYS:
            flag(node, f"the older key {node.value!r}")
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id in FIELDS and _number(node.value) is not None:
                flag(node, f"a field {node.target.id} with a literal default")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args.posonlyargs + node.args.args
            pairs = list(
                zip(args[len(args) - len(node.args.defaults) :], node.args.defaults, strict=True)
            )
            pairs += list(zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True))
            for arg, value in pairs:
                if arg.arg in FIELDS and _number(value) is not None:
                    flag(node, f"a parameter {arg.arg} with a literal default")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("get", "setdefault", "pop") and len(node.args) == 2:
                if _key(node.args[0]) and _number(node.args[1]) is not None:
                    flag(node, f"{name}({_key(node.args[0])!r}, a literal)")
            if name == "add_argument" and any(
                isinstance(a, ast.Constant) and a.value in FLAGS for a in node.args
            ):
                for kw in node.keywords:
                    if kw.arg == "default" and _number(kw.value) is not None:
                        flag(node, "a command-line flag with a literal default")
            for kw in node.keywords:
                if kw.arg in FIELDS and _number(kw.value) == default[kw.arg]:
                    flag(node, f"{kw.arg}= the default written out")
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if _key(k) and _number(v) == default[_key(k)]:
                    flag(node, f"{_key(k)!r}: the default written out")
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts, strict=False))
                for t, v in pairs:
                    if isinstance(t, ast.Subscript) and _key(t):
                        if _number(v) == default[_key(t)]:
                            flag(node, f"[{_key(t)!r}] = the default written out")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if re.search(r"batch|delay", text) and re.search(r"default \d", text):
                flag(node, "a text that states a default")
    return found


SOURCES = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if p != HOME)


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_no_module_writes_a_batching_default_again(path):
    found = copies(path.read_text())
    assert not found, (
        f"{path.relative_to(ROOT)}: {'; '.join(found)} -- read typhoon.topology.batching "
        "(DEFAULTS, Batching.of) instead"
    )


@pytest.mark.parametrize(
    "source",
    [
        "class O:\n    batch_size: int = 100\n",
        "class O:\n    max_delay_ms: float = 3.0\n",
        "def f(batch_size=64): ...\n",
        "def f(*, max_delay_ms=2.0): ...\n",
        "x = config.get('batch_size', 100)\n",
        "x = config.get('max_delay_ms', config.get('max_delay', 2.0))\n",
        "ap.add_argument('--batch-size', type=int, default=100)\n",
        "RunSpec('tcp', 1, t, batch_size=100)\n",
        "topo.config['batch_size'] = 100\n",
        "topo.config['batch_size'], topo.config['max_delay_ms'] = 100, 2.0\n",
        "c = {'batch_size': 100}\n",
        "r.add_argument('--batch-size', help='tuples per batch (default 100)')\n",
    ],
)
def test_the_scan_finds_a_copy(source):
    assert copies(source), source


def test_the_scan_leaves_a_chosen_value_and_the_declaration_alone():
    chosen = "RunSpec('tcp', 1, t, batch_size=1)\ntopo.config['batch_size'] = 10\nBATCH = 100\n"
    assert copies(chosen) == []
    assert copies("class O:\n    batch_size: int = DEFAULTS.batch_size\n") == []
