"""How one ``typhoon`` verb on the REST API runs: its client, its errors, its output.

The REST API is the controller's for an sdn job, or a running tcp job's own
control endpoint (:mod:`typhoon.tcp_control`), found by the job's name
(:func:`client_of`).

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

from typhoon.client import ApiCallError, Client, Endpoint, resolve
from typhoon.private_files import SecretFileError
from typhoon.tcp_jobs import TcpJob, jobs_dir, lookup

EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """The verb refuses its input (exit 2)."""


class VerbFailed(Exception):
    """The verb ran but what it did failed (exit 1)."""


def client_of(args: argparse.Namespace) -> Client:
    """The client of the job the verb names: a running tcp job of that name
    (:mod:`typhoon.tcp_jobs`: its own endpoint and token) unless ``--controller`` or
    ``--config`` names a controller; else the controller that ``--controller``,
    ``--token`` and ``--config`` name (:func:`typhoon.client.resolve`)."""
    job = tcp_job_of(args)
    if job is not None:
        args.tcp_job = job
        return Client(Endpoint(job.url, job.token), retries=1)
    return Client(resolve(args.controller, args.token, args.config))


def tcp_job_of(args: argparse.Namespace) -> TcpJob | None:
    """The running tcp job ``args.name`` names, unless a controller is named explicitly."""
    name = getattr(args, "name", None)
    if not name or getattr(args, "controller", None) or getattr(args, "config", None):
        return None
    try:
        return lookup(name)
    except SecretFileError as e:
        raise UsageError(str(e)) from None


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
        message = e.message if e.status else unanswered(args, e.message)
        return fail(args, message, EXIT_USAGE if e.bad_request else EXIT_FAILED, out, err)


def unanswered(args: argparse.Namespace, message: str) -> str:
    """Nothing answered: a tcp job that ended, or a controller that is not there (and no tcp
    job of that name either)."""
    job: TcpJob | None = getattr(args, "tcp_job", None)
    if job is not None:
        return (
            f"the tcp run '{job.name}' (process {job.pid}) did not answer at {job.url}: "
            "it has probably just ended"
        )
    name = getattr(args, "name", None)
    if name and not (getattr(args, "controller", None) or getattr(args, "config", None)):
        return (
            f"{message}; no tcp run named '{name}' is running for this user either "
            f"(typhoon run --transport tcp registers its runs in {jobs_dir()})"
        )
    return message


def fail(args: argparse.Namespace, message: str, code: int, out: TextIO, err: TextIO) -> int:
    """One line on stderr, or with ``--json`` one document on stdout."""
    if getattr(args, "json", False):
        print(json.dumps({"ok": False, "error": message, "exit": code}), file=out)
    else:
        print(f"error: {message}", file=err)
    return code
