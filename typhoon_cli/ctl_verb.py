"""How one ``typhoon`` verb on the REST API runs: its client, its errors, its output.

Every verb module (:mod:`typhoon_cli.ctl`, :mod:`typhoon_cli.ctl_control`) builds on this one
and none on another, so the verbs import each other one way only.  A verb raises
:class:`UsageError` for input it refuses (exit 2) and :class:`VerbFailed` when what it
did failed (exit 1); :func:`run` turns both, and the controller's refusals, into one
line on stderr, or with ``--json`` one document on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from typhoon.client import ApiCallError, Client, resolve

EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """The verb refuses its input (exit 2)."""


class VerbFailed(Exception):
    """The verb ran but what it did failed (exit 1)."""


def client_of(args: argparse.Namespace) -> Client:
    """The REST client the verb's ``--controller``, ``--token`` and ``--config`` name."""
    return Client(resolve(args.controller, args.token, args.config))


def json_result(args: argparse.Namespace, out: TextIO, doc: Any, code: int) -> int:
    """``--json``'s one document on stdout; returns ``code``."""
    print(json.dumps({"ok": code == 0, "result": doc}, indent=2, default=str), file=out)
    return code


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run a verb; refusals become exit code 2 with one line, failures 1."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        return args.ctl_func(args, out, err)
    except UsageError as e:
        return fail(args, str(e), EXIT_USAGE, out, err)
    except VerbFailed as e:
        return fail(args, str(e), EXIT_FAILED, out, err)
    except ApiCallError as e:
        return fail(args, e.message, EXIT_USAGE if e.bad_request else EXIT_FAILED, out, err)


def fail(args: argparse.Namespace, message: str, code: int, out: TextIO, err: TextIO) -> int:
    """One line on stderr, or with ``--json`` one document on stdout."""
    if getattr(args, "json", False):
        print(json.dumps({"ok": False, "error": message, "exit": code}), file=out)
    else:
        print(f"error: {message}", file=err)
    return code
