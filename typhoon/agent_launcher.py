"""How an sdn host's agent starts its worker processes: forked from a zygote of its own.

A fresh ``python -m typhoon.runtime.worker SPEC`` pays ~0.15 s of CPU in
imports before it opens its TAP; an emulated cluster's agents share two cores,
so seven workers cost about a second.  An agent (typhoon.agent) therefore
starts one worker fork server when it starts (typhoon.zygote, the tcp runner's
zygote with the sdn transport and every built-in operator imported), in its
own host's namespaces, and forks each worker there: the first launch, a
relaunch after a fault, a rescale's newcomers, a chain's one process.  While
the agent starts up, the zygote imports alongside it; the first fork waits for
it to be ready.

The zygote is *detached*: a child starts a session of its own and outlives it,
as a spawned worker outlives its agent, so an agent killed and started again
adopts the workers still running by their pid and spec path (their process
title is the worker command line; under a path with a space they are spawned).
Should the zygote be unusable (it died, refused, or never got ready) every
later worker is spawned, with one log line saying why; an agent run with
``--worker-cmd`` spawns that command as before.
"""

from __future__ import annotations

import logging
from pathlib import Path

from typhoon.operators.builtins import PATHS
from typhoon.supervised import Supervised
from typhoon.zygote import Zygote, ZygoteLauncher

log = logging.getLogger("typhoon.agent")


def agent_zygote(workdir: Path, host: str) -> ZygoteLauncher | None:
    """A started zygote for ``host``'s workers (log ``zygote-HOST.log``), or None if it
    cannot start (then :func:`spawn` starts them).

    A forked worker's command line is one title that is split at spaces again
    (typhoon.supervised.command_line): under a work directory whose path holds
    one, a restarted agent could not find a spec path in it, so it spawns.
    """
    if " " in str(workdir):
        log.warning("workers are spawned, not forked: the work directory's path holds a space")
        return None
    try:
        zygote = Zygote(
            workdir / f"zygote-{host}.log", sorted(PATHS), True, transport="sdn", detach=True
        )
    except OSError as e:
        log.error("no worker zygote (%s): workers are spawned", e)
        return None
    return ZygoteLauncher(zygote, append=True, own_session=True)


def spawn(host: str, argv: list[str], logfile: Path) -> Supervised:
    """A worker as its own process, in a session of its own (the agent's terminal signals
    reach only the agent), its log appended to."""
    return Supervised.start(logfile.stem, argv, logfile)
