"""The Ryu side of ``controller/settings.py``: register a settings class's
options in its section of the Ryu config, and read the instance back."""

from __future__ import annotations

from typing import TypeVar

from controller.framework.ryu_compat import cfg
from controller.settings import Option, from_section, options

T = TypeVar("T")

_OPTS = {"float": cfg.FloatOpt, "int": cfg.IntOpt, "bool": cfg.BoolOpt, "str": cfg.StrOpt}


def _opt(o: Option) -> cfg.Opt:
    if o.kind == "list":
        return cfg.ListOpt(o.name, default=list(o.default), help=o.help)
    return _OPTS[o.kind](o.name, default=o.default, help=o.help)


def register_settings(cls: type) -> None:
    """Declare the options of ``cls`` in section ``[cls.section]`` (at import time,
    like any Ryu app's options)."""
    cfg.CONF.register_opts([_opt(o) for o in options(cls)], group=cls.section)


def read_settings(cls: type[T]) -> T:
    """The settings as the config file (or the defaults) set them."""
    return from_section(cls, getattr(cfg.CONF, cls.section))
