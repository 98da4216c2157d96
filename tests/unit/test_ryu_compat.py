"""The controller's framework boundary: Ryu or os-ken, chosen in one place.

Every module of controller/ and apps/ takes its framework names from
controller/framework/ryu_compat.py (so the same code runs on both); controller/framework/backend.py
picks the framework.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.framework import backend

REPO = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("ryu", "os_ken")
# The only modules allowed to import a framework: the boundary itself, the os-ken port of
# Ryu's REST framework, and the launcher that starts either.
BOUNDARY = {
    "controller/framework/ryu_compat.py",
    "controller/framework/osken_wsgi.py",
    "controller/framework/launcher.py",
}


def framework_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [n for n in names if n.split(".")[0] in FRAMEWORKS]
    return found


def test_only_the_boundary_imports_ryu_or_os_ken():
    offenders = {}
    for path in sorted([*REPO.glob("controller/**/*.py"), *REPO.glob("apps/*.py")]):
        rel = path.relative_to(REPO).as_posix()
        if rel not in BOUNDARY and (names := framework_imports(path)):
            offenders[rel] = names
    assert offenders == {}


def test_the_scan_sees_an_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\nfrom ryu.lib import hub\nimport os_ken.cfg as c\nfrom . import ryu\n")
    assert framework_imports(f) == ["ryu.lib", "os_ken.cfg"]


def present(*names):
    return lambda module: module in names


def test_ryu_wins_when_both_are_installed_and_none_is_asked_for():
    assert backend.choose(None, present("ryu", "os_ken")) == "ryu"
    assert backend.choose("", present("os_ken")) == "os_ken"


@pytest.mark.parametrize("name", ["os-ken", "os_ken", "OSKEN", " os-ken "])
def test_an_explicit_choice_beats_the_preference(name):
    assert backend.choose(name, present("ryu", "os_ken")) == "os_ken"


def test_an_explicit_choice_must_be_installed():
    with pytest.raises(backend.BackendError, match="ryu requested but not installed"):
        backend.choose("ryu", present("os_ken"))


def test_unknown_and_missing_backends_say_what_to_do():
    with pytest.raises(backend.BackendError, match="unknown controller backend 'pox'"):
        backend.choose("pox", present("ryu"))
    with pytest.raises(backend.BackendError, match="neither Ryu nor os-ken is installed"):
        backend.choose(None, present())


def test_the_environment_selects_the_backend_of_ryu_compat():
    """In a fresh interpreter, as the controller process starts."""
    want = backend.choose(None)
    code = "import controller.framework.ryu_compat as r, sys; print(r.BACKEND, r.RyuApp.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env={**_env(), backend.ENV: want})  # fmt: skip
    assert out.stdout.split() == [want, f"{want}.base.app_manager"]
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, env={**_env(), backend.ENV: "pox"})  # fmt: skip
    assert bad.returncode != 0 and "unknown controller backend 'pox'" in bad.stderr


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != backend.ENV}
