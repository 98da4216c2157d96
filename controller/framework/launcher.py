"""The controller's launcher: ``ryu-manager`` for either backend,
``python -m controller.framework.launcher [ryu-manager args]``.

Not the streaming manager (``typhoon/manager.py``): this one starts the Ryu/os-ken
process that loads the controller's apps.

On Ryu it is Ryu's own ``ryu.cmd.manager.main`` (after the eventlet fix).
os-ken dropped its ``osken-manager`` command in 4.0; ``_run_os_ken`` does what
``ryu-manager`` does with os-ken's parts: read the config, load the apps with
what they require, instantiate them, and serve the REST API
(controller/framework/osken_wsgi.py) when an app asked for the ``wsgi`` context.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from controller.framework import backend


def _run_os_ken(args: list[str] | None, prog: str | None) -> None:
    os.environ.setdefault("OSKEN_HUB_TYPE", "eventlet")
    from os_ken.lib import hub

    hub.patch(thread=False)  # as ryu-manager: sockets now, threads after the config
    from os_ken import cfg, log

    log.early_init_log(logging.DEBUG)
    import os_ken.flags  # noqa: F401 - registers os-ken's own options
    from os_ken import __version__ as version
    from os_ken.base.app_manager import AppManager

    # after app_manager, as in ryu-manager (they import each other): the ofp-* options
    importlib.import_module("os_ken.controller.controller")

    from controller.framework import osken_wsgi

    conf = cfg.CONF
    conf.register_cli_opts(
        [
            cfg.ListOpt("app-lists", default=[], help="application module names to run"),
            cfg.MultiStrOpt("app", positional=True, default=[], help="application to run"),
            cfg.StrOpt("pid-file", default=None, help="pid file name"),
        ]
    )
    conf(args=args, prog=prog, project="os_ken", version=f"typhoon-controller (os-ken {version})")
    log.init_log()
    hub.patch(thread=True)
    if conf.pid_file:
        with open(conf.pid_file, "w") as f:
            f.write(str(os.getpid()))
    app_mgr = AppManager.get_instance()
    app_mgr.load_apps(conf.app_lists + conf.app or ["os_ken.controller.ofp_handler"])
    contexts = app_mgr.create_contexts()
    services = list(app_mgr.instantiate_apps(**contexts))
    webapp = osken_wsgi.start_service(app_mgr)
    if webapp:
        services.append(hub.spawn(webapp))
    try:
        hub.joinall(services)
    except KeyboardInterrupt:
        pass
    finally:
        app_mgr.close()


def main(args: list[str] | None = None, prog: str | None = None) -> int:
    """Run the controller with ``args`` (ryu-manager's command line) on the selected backend."""
    try:
        chosen = backend.selected()
    except backend.BackendError as e:
        print(f"{prog or 'controller'}: error: {e}", file=sys.stderr)
        return 1
    if chosen == backend.OS_KEN:
        _run_os_ken(args, prog)
        return 0
    from controller.framework.eventlet_fix import install

    install()  # before the first Ryu import
    try:
        from ryu.cmd.manager import main as ryu_main
    except ImportError as e:
        print(f"{prog or 'controller'}: error: Ryu does not import ({e})", file=sys.stderr)
        return 1
    ryu_main(args=args, prog=prog)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "typhoon-controller"))
