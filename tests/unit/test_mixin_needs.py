"""A runtime mixin declares what it uses of its host (a ``Protocol``), and the host has it.

``Framework`` is built of eight mixins (output.py, output_columns.py, control.py, guarantee.py,
upstream_backup.py, keyed_cut.py, migration.py, watermarks.py) and ``SdnTransport`` of
four (sdn_receive.py, sdn_credit.py, sdn_send.py, sdn_balanced.py).  Each reads state
its host sets and calls methods of its sibling mixins, and each family names all of that
in one protocol (``FrameworkParts``, ``SdnParts``) that a type checker sees as every
mixin's base.  Checked on the source here: every ``self.X`` a mixin reads is its own or
declared; every declaration is used by one of the mixins; the host sets every declared
attribute and has every declared method with the declared parameters; the protocol is
no base at run time (its stubs would shadow the siblings' methods).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Protocol

import pytest

from typhoon.runtime.control import ControlHandling
from typhoon.runtime.framework import Framework
from typhoon.runtime.framework_parts import FrameworkParts
from typhoon.runtime.guarantee import GuaranteedProcessing
from typhoon.runtime.keyed_cut import KeyedCheckpoints
from typhoon.runtime.migration import KeyedMigration
from typhoon.runtime.output import OutputBatching
from typhoon.runtime.output_columns import ColumnOutput
from typhoon.runtime.sdn import SdnTransport
from typhoon.runtime.sdn_balanced import SdnBalancedSending
from typhoon.runtime.sdn_credit import SdnCredit
from typhoon.runtime.sdn_parts import SdnParts
from typhoon.runtime.sdn_receive import SdnReceiving
from typhoon.runtime.sdn_send import SdnSending
from typhoon.runtime.upstream_backup import UpstreamBackup
from typhoon.runtime.watermarks import WatermarkHandling

# protocol -> (the host class, the mixins that declare what they use with it)
FAMILIES = {
    FrameworkParts: (
        Framework,
        [
            OutputBatching,
            ColumnOutput,
            ControlHandling,
            GuaranteedProcessing,
            UpstreamBackup,
            KeyedCheckpoints,
            KeyedMigration,
            WatermarkHandling,
        ],
    ),
    SdnParts: (SdnTransport, [SdnReceiving, SdnCredit, SdnSending, SdnBalancedSending]),
}
MIXINS = [(mixin, proto) for proto, (_, mixins) in FAMILIES.items() for mixin in mixins]


def _class_tree(cls: type) -> ast.ClassDef:
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(node, ast.ClassDef)
    return node


def self_names(cls: type) -> tuple[set[str], set[str]]:
    """(names read as ``self.X``, names assigned as ``self.X``) in the class's source."""
    reads, stores = set(), set()
    tree = _class_tree(cls)
    # self.x += 1 reads x first: it declares nothing
    augmented = {id(n.target) for n in ast.walk(tree) if isinstance(n, ast.AugAssign)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "self":
                store = isinstance(node.ctx, ast.Store) and id(node) not in augmented
                (stores if store else reads).add(node.attr)
    return reads, stores


def own_names(cls: type) -> set[str]:
    """What the class itself defines: its methods and class attributes, and the
    attributes its methods assign."""
    return set(vars(cls)) | set(vars(cls).get("__annotations__", {})) | self_names(cls)[1]


def declared(proto: type) -> tuple[set[str], set[str]]:
    """(attributes, methods) a protocol declares itself."""
    methods = {n for n, v in vars(proto).items() if inspect.isfunction(v) and n[:2] != "__"}
    return set(getattr(proto, "__annotations__", {})), methods


def undeclared(mixin: type, proto: type) -> set[str]:
    attrs, methods = declared(proto)
    return self_names(mixin)[0] - own_names(mixin) - attrs - methods


def unused(mixins: list[type], proto: type) -> set[str]:
    attrs, methods = declared(proto)
    used: set[str] = set()
    for mixin in mixins:
        reads, stores = self_names(mixin)
        used |= reads | stores
    return (attrs | methods) - used


def host_sets(host: type) -> set[str]:
    """Every attribute a class or one of its bases assigns on ``self`` or defines."""
    found: set[str] = set()
    for cls in host.__mro__:
        if cls is object:
            continue
        found |= set(vars(cls))
        try:
            found |= self_names(cls)[1]
        except (OSError, TypeError):  # a class without source (builtins)
            pass
    return found


def _shape(f) -> list[tuple[str, object, bool]]:
    return [
        (p.name, p.kind, p.default is not inspect.Parameter.empty)
        for p in inspect.signature(f).parameters.values()
    ]


def unprovided(proto: type, host: type) -> list[str]:
    attrs, methods = declared(proto)
    sets = host_sets(host)
    problems = [f"{host.__name__} never sets {name}" for name in sorted(attrs - sets)]
    for name in sorted(methods):
        impl = getattr(host, name, None)
        if impl is None:
            problems.append(f"{host.__name__} has no method {name}")
        elif _shape(impl) != _shape(vars(proto)[name]):
            problems.append(f"{host.__name__}.{name}{inspect.signature(impl)} is not as declared")
    return problems


@pytest.mark.parametrize(("mixin", "proto"), MIXINS, ids=[m.__name__ for m, _ in MIXINS])
def test_the_mixin_declares_every_name_it_uses(mixin, proto):
    assert undeclared(mixin, proto) == set(), f"{mixin.__name__} uses, undeclared in {proto}"
    assert proto not in mixin.__mro__  # a checker's base only


@pytest.mark.parametrize("proto", list(FAMILIES), ids=[p.__name__ for p in FAMILIES])
def test_every_declaration_is_used_and_the_host_provides_it(proto):
    host, mixins = FAMILIES[proto]
    assert unused(mixins, proto) == set(), f"{proto.__name__} declares, no mixin uses"
    assert unprovided(proto, host) == []
    assert all(issubclass(host, m) for m in mixins) and proto not in host.__mro__


# ----- the checks can fail ------------------------------------------------------------------


class _Needs(Protocol):
    size: int

    def grow(self, by: int) -> None: ...


class _Mixin:
    def use(self) -> int:
        self.grow(1)
        self.count = self.size + self.extra  # extra: undeclared
        return self.count


class _Host(_Mixin):
    def __init__(self) -> None:
        self.extra = 0

    def grow(self, by: int, twice: bool = False) -> None:  # not as declared
        pass


def test_the_checks_find_an_undeclared_name_a_missing_attribute_and_a_changed_method():
    assert undeclared(_Mixin, _Needs) == {"extra"}
    assert unused([_Mixin], _Needs) == set()
    assert unprovided(_Needs, _Host) == [
        "_Host never sets size",
        "_Host.grow(self, by: 'int', twice: 'bool' = False) -> 'None' is not as declared",
    ]
