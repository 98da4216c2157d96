"""``typhoon-controller``: the Ryu controller with the Typhoon core, as a daemon.

It reads the operator's INI file (sample: deploy/controller.conf), writes the
config file Ryu reads (mode 0600: it holds the API tokens), and runs
``ryu-manager`` in this process with the core and the chosen apps::

    [controller]                # read here, not by Ryu
    apps = fault_detector, load_balancer
    ofp_listen_host = 0.0.0.0
    ofp_port = 6653
    wsapi_host = 127.0.0.1
    wsapi_port = 8080
    api_token_file = /etc/typhoon/api-token
    read_token_file = /etc/typhoon/read-token   # optional: then every GET needs it
    ctl_privkey = ...           # OpenFlow over TLS: all three, or none
    ctl_cert = ...
    ca_certs = ...

    [typhoon]                   # every other section goes to Ryu as it is
    coordinator = zk://10.0.0.1:2181/typhoon

Running the controller in-process (controller/framework/launcher.py) lets this entry point
apply the Ryu 4.34 fix for eventlet (controller/framework/eventlet_fix.py) first, so an
installed package needs no ``.pth`` file, and run on os-ken instead of Ryu
(``--backend``, controller/framework/backend.py).
"""

from __future__ import annotations

import argparse
import configparser
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from controller.framework import backend
from typhoon.private_files import write_private

APPS = ("fault_detector", "live_debugger", "load_balancer", "autoscaler")
CORE = "controller.core"
OWN = "controller"  # the section this wrapper reads; the others are Ryu's
TLS_FILES = ("ctl_privkey", "ctl_cert", "ca_certs")
DEFAULT_CONFIG = Path("/etc/typhoon/controller.conf")


REDACTED = "<redacted: read from api_token_file>"


class ControllerConfigError(ValueError):
    """The operator's controller configuration cannot be used; one sentence."""


@dataclass
class ControllerSettings:
    apps: list[str] = field(default_factory=list)
    ofp_listen_host: str = "0.0.0.0"
    ofp_port: int = 6653
    wsapi_host: str = "127.0.0.1"
    wsapi_port: int = 8080
    api_token: str = ""
    read_token: str = ""
    tls: dict[str, str] = field(default_factory=dict)
    sections: dict[str, dict[str, str]] = field(default_factory=dict)  # passed to Ryu

    def ryu_config(self, redact: bool = False) -> str:
        """The text of the config file ``ryu-manager --config-file`` reads (``redact``: the
        API token replaced by a mark, for showing it)."""
        port_key = "ofp_ssl_listen_port" if self.tls else "ofp_tcp_listen_port"
        sections: dict[str, dict[str, str]] = {
            "DEFAULT": {
                "ofp_listen_host": self.ofp_listen_host,
                port_key: str(self.ofp_port),
                "wsapi_host": self.wsapi_host,
                "wsapi_port": str(self.wsapi_port),
                **self.tls,
            },
            **{name: dict(values) for name, values in self.sections.items()},
        }
        typhoon = sections.setdefault("typhoon", {})
        if self.api_token:
            typhoon["api_token"] = REDACTED if redact else self.api_token
        if self.read_token:
            typhoon["read_token"] = REDACTED if redact else self.read_token
        if not typhoon.get("coordinator"):
            raise ControllerConfigError(
                "no coordinator: set [typhoon] coordinator or --coordinator"
            )
        lines: list[str] = []
        for name, values in sections.items():
            for key, value in values.items():
                if "\n" in value:
                    raise ControllerConfigError(f"[{name}] {key}: a value of one line only")
            lines += [f"[{name}]", *(f"{k} = {v}" for k, v in values.items()), ""]
        return "\n".join(lines)

    def ryu_argv(self, config_path: Path) -> list[str]:
        return ["--config-file", str(config_path), CORE, *(f"apps.{a}" for a in self.apps)]


def _apps(text: str) -> list[str]:
    names = [a.strip() for a in text.replace(",", " ").split() if a.strip()]
    if names == ["all"]:
        return list(APPS)
    for a in names:
        if a not in APPS:
            raise ControllerConfigError(f"unknown app '{a}' (apps: {', '.join(APPS)}, or all)")
    return list(dict.fromkeys(names))


def _port(where: str, text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise ControllerConfigError(f"{where} must be a port number, not {text!r}")
    return port


def _token(option: str, path: str | None) -> str:
    """The token in the file ``path`` (one line); "" without a path."""
    if not path:
        return ""
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise ControllerConfigError(f"{option} {path}: {e.strerror or e}") from e
    if not token:
        raise ControllerConfigError(f"{option} {path} is empty")
    return token


def load_settings(path: Path | None, args: argparse.Namespace) -> ControllerSettings:
    """The operator's file (optional) with the command line's overrides on top."""
    parser = configparser.ConfigParser(interpolation=None)
    if path is not None:
        try:
            with open(path) as f:
                parser.read_file(f)
        except OSError as e:
            raise ControllerConfigError(f"{path}: cannot read: {e.strerror or e}") from e
        except configparser.Error as e:
            raise ControllerConfigError(f"{path}: not an INI file: {e}") from e
    own = dict(parser[OWN]) if parser.has_section(OWN) else {}
    known = {"apps", "ofp_listen_host", "ofp_port", "wsapi_host", "wsapi_port",
             "api_token_file", "read_token_file", *TLS_FILES}  # fmt: skip
    for key in own:
        if key not in known:
            raise ControllerConfigError(
                f"[{OWN}] {key}: unknown key (known: {', '.join(sorted(known))})"
            )
    s = ControllerSettings()
    s.apps = _apps(args.app and ",".join(args.app) or own.get("apps", ""))
    s.ofp_listen_host = args.ofp_listen_host or own.get("ofp_listen_host", s.ofp_listen_host)
    s.ofp_port = _port("ofp_port", str(args.ofp_port or own.get("ofp_port", s.ofp_port)))
    s.wsapi_host = args.wsapi_host or own.get("wsapi_host", s.wsapi_host)
    s.wsapi_port = _port("wsapi_port", str(args.wsapi_port or own.get("wsapi_port", s.wsapi_port)))
    s.api_token = _token("api_token_file", args.api_token_file or own.get("api_token_file"))
    s.read_token = _token("read_token_file", args.read_token_file or own.get("read_token_file"))
    tls = {k: own[k] for k in TLS_FILES if own.get(k)}
    if tls and len(tls) != len(TLS_FILES):
        raise ControllerConfigError(f"OpenFlow TLS needs all of {', '.join(TLS_FILES)}")
    for k, f in tls.items():
        if not Path(f).is_file():
            raise ControllerConfigError(f"{k} {f}: no such file")
    s.tls = tls
    s.sections = {name: dict(parser[name]) for name in parser.sections() if name != OWN}
    if args.coordinator:
        s.sections.setdefault("typhoon", {})["coordinator"] = args.coordinator
    return s


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="typhoon-controller",
        description="Run the Typhoon SDN controller (Ryu, the core and the chosen apps).",
    )
    p.add_argument(
        "--config",
        type=Path,
        help=f"operator's INI file (default: {DEFAULT_CONFIG} if it exists)",
    )
    p.add_argument("--coordinator", help="coordinator URL (overrides [typhoon] coordinator)")
    p.add_argument("--app", action="append", help=f"app to load: {', '.join(APPS)}, all")
    p.add_argument("--ofp-listen-host")
    p.add_argument("--ofp-port", type=int)
    p.add_argument("--wsapi-host")
    p.add_argument("--wsapi-port", type=int)
    p.add_argument("--api-token-file")
    p.add_argument("--read-token-file", help="token every GET then needs (reading is open without)")
    p.add_argument(
        "--backend",
        help=f"ryu or os-ken (default: ${backend.ENV}, else Ryu if installed, else os-ken)",
    )
    p.add_argument("--runtime-dir", type=Path,
                   help="where the generated Ryu config goes (default: $RUNTIME_DIRECTORY "
                        "under systemd, else a temporary directory)")  # fmt: skip
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the Ryu config and the ryu-manager arguments, then exit",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    path = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    try:
        settings = load_settings(path, args)
        text = settings.ryu_config()
    except ControllerConfigError as e:
        print(f"typhoon-controller: error: {e}", file=sys.stderr)
        return 2
    if args.backend:
        os.environ[backend.ENV] = args.backend  # ryu_compat reads it, in this process
    try:
        chosen = backend.selected()
    except backend.BackendError as e:
        print(f"typhoon-controller: error: {e}", file=sys.stderr)
        return 2
    runtime = args.runtime_dir or os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if args.print_config:  # shown, never written: the token stays in its file
        print(settings.ryu_config(redact=True))
        conf = Path(runtime or "<a temporary directory>") / "ryu.conf"
        print(f"{'ryu-manager' if chosen == backend.RYU else 'controller.framework.launcher'} "
              + " ".join(settings.ryu_argv(conf)) + f"  # backend: {chosen}")  # fmt: skip
        return 0
    temporary = not runtime
    directory = Path(tempfile.mkdtemp(prefix="typhoon-controller-")) if temporary else Path(runtime)
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "ryu.conf"
    write_private(conf, text)  # holds the tokens: 0600 even over an older, looser file
    from controller.framework import launcher

    try:
        return launcher.main(settings.ryu_argv(conf), "typhoon-controller")
    finally:  # the token's copy goes with the controller (systemd removes its runtime dir)
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
