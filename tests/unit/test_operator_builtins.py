"""The lazy registry of built-in operators behaves as the dict it replaced."""

import importlib
import sys

import pytest

from typhoon.operators import BUILTINS, Bolt, OperatorError, resolve_operator
from typhoon.operators.builtins import PATHS, Builtins, load_builtin


def test_every_builtin_name_resolves_to_an_operator_class_of_its_module():
    for name, path in PATHS.items():
        cls = load_builtin(path)
        module = importlib.import_module(f"typhoon.operators.{path.partition(':')[0]}")
        assert getattr(module, path.partition(":")[2]) is cls
        assert BUILTINS[name] is cls and resolve_operator(name) is cls


def test_membership_and_names_import_nothing():
    reg = Builtins({"lazy_probe": "no_such_module:Nothing"})
    assert "lazy_probe" in reg and "other" not in reg
    assert list(reg) == ["lazy_probe"] and len(reg) == 1
    assert "typhoon.operators.no_such_module" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        reg["lazy_probe"]


def test_a_path_that_is_not_an_operator_is_refused():
    with pytest.raises(TypeError, match="not an operator class"):
        Builtins({"bad": "builtins:PATHS"})["bad"]


def test_names_added_and_removed_like_a_dict():
    class Mine(Bolt):
        def process(self, tup, emit):
            emit(tup)

    BUILTINS["mine_probe"] = Mine
    try:
        assert resolve_operator("mine_probe") is Mine and "mine_probe" in BUILTINS
    finally:
        BUILTINS.pop("mine_probe")
    assert "mine_probe" not in BUILTINS
    with pytest.raises(OperatorError, match="unknown operator 'mine_probe'.*split_words"):
        resolve_operator("mine_probe")


def test_connector_error_is_exported_on_first_use():
    from typhoon.operators import ConnectorError
    from typhoon.operators.connectors import ConnectorError as Defined

    assert ConnectorError is Defined
