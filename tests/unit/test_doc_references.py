"""Every file and module a docstring, comment or doc names exists in the repository.

Paths (``controller/rules/flows.py``, ``docs/guarantees.md``) must be files or folders
of the checkout; dotted names in backticks (``typhoon.runtime.links``,
:mod:`typhoon.wire`, ``typhoon.agent.main``) must be a module, or a name that
module defines.  So a split or a rename cannot leave a reader at a dead end.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("typhoon", "typhoon_cli", "controller", "apps", "mininet_env", "pyspark_bridge",
            "benchmarks")  # fmt: skip
TOPS = (*PACKAGES, "docs", "tests", "scripts", "deploy", "topologies")
EXTENSIONS = ("py", "md", "yaml", "yml", "json", "sh", "service", "conf", "toml", "txt", "png")
PATH = re.compile(
    r"(?<![\w/.-])((?:{})/[\w/.-]*\.(?:{}))(?![\w-])".format("|".join(TOPS), "|".join(EXTENSIONS))
)
DOTTED = re.compile(r"`((?:{})(?:\.[A-Za-z_]\w*)+)`".format("|".join(PACKAGES)))
PLACEHOLDER = re.compile(r"/[A-Z]+\.")  # apps/APP.py: a metavar, not a file
# named on purpose as files that must not exist (the reason is next to each mention)
ABSENT = {"apps/typhoon.py"}


def sources() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "*.py", "*.md"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / f for f in listed if not f.startswith(("benchmarks/results/", "tests/"))]


def defines(module: Path, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", module.read_text()) is not None


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:k])
        for module in (base.with_suffix(".py"), base / "__init__.py"):
            if module.is_file():
                return k == len(parts) or defines(module, parts[k])
    return False


def test_named_paths_exist() -> None:
    missing = []
    for f in sources():
        for m in PATH.finditer(f.read_text(errors="replace")):
            path = m.group(1)
            if path in ABSENT or PLACEHOLDER.search(path):
                continue
            if not (REPO / path).exists():
                missing.append(f"{f.relative_to(REPO)}: {path}")
    assert not missing, "\n".join(missing)


def test_named_modules_exist() -> None:
    missing = []
    for f in sources():
        for m in DOTTED.finditer(f.read_text(errors="replace")):
            if m.group(1).rsplit(".", 1)[1] in EXTENSIONS + ("log",):
                continue  # a file name (`controller.conf`), not a module
            if not resolves(m.group(1)):
                missing.append(f"{f.relative_to(REPO)}: {m.group(1)}")
    assert not missing, "\n".join(missing)


def test_the_checks_see_a_dead_reference(tmp_path: Path) -> None:
    assert PATH.findall("see `typhoon/wire/frames.py` and docs/nothing.md.") == [
        "typhoon/wire/frames.py",
        "docs/nothing.md",
    ]
    assert resolves("typhoon.wire.pack_frames") and resolves("typhoon.runtime.links")
    assert not resolves("typhoon.runtime.credits") and not resolves("typhoon.wire.no_such_name")
