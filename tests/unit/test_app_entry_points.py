"""Files in apps/ must be loadable by path: `ryu-manager apps/<name>.py`.

ryu-manager imports such a file as the top-level module `<name>`; a name that
is also an importable module or package (say `typhoon`) would replace it in
`sys.modules` for the whole controller process.
"""

import importlib.util
from pathlib import Path

import pytest

APPS = Path(__file__).resolve().parents[2] / "apps"


@pytest.mark.parametrize("app", sorted(p.stem for p in APPS.glob("*.py") if p.stem != "__init__"))
def test_app_file_name_shadows_no_module(app):
    assert importlib.util.find_spec(app) is None, (
        f"apps/{app}.py is named like the importable module {app!r}: "
        f"`ryu-manager apps/{app}.py` would hide it; rename the file"
    )
