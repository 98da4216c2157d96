"""ZooKeeper credentials: digest authentication and creator-only ACLs.

Without them every znode has ZooKeeper's open ACL, and whoever reaches port
2181 can rewrite ``physical/*`` and make agents start any operator.  The
coordinator URL names a credentials file, never the secret itself (URLs end up
in logs, ``ps`` and unit files)::

    zk://10.0.0.1:2181/typhoon?auth_file=/etc/typhoon/zk-auth

The file holds one line ``user:password`` and must not be readable by group
or others (mode 0600).  Every process of the deployment uses the same
identity: it authenticates with the ``digest`` scheme, and every znode it
creates gets ``CREATOR_ALL_ACL`` (all rights to that identity, none to anyone
else).  A store made before ACLs were turned on is secured at the first
connection with credentials (``secure_tree`` in ``zk_session.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs

from typhoon.private_files import SecretFileError, read_secret

from .base import CoordinatorError

QUERY_KEYS = ("auth_file",)


@dataclass(frozen=True)
class ZkUrl:
    """A ``zk://`` URL taken apart; ``auth`` is ``user:password`` or None (open ACLs)."""

    hosts: str
    prefix: str
    auth_file: str | None = None

    def credentials(self) -> str | None:
        return None if self.auth_file is None else read_credentials(self.auth_file)


def split_query(url: str) -> tuple[str, dict[str, str]]:
    """``zk://...?k=v`` -> (the URL without the query, {k: v}); unknown keys are refused."""
    base, _, query = url.partition("?")
    params: dict[str, str] = {}
    for key, values in parse_qs(query, keep_blank_values=True, strict_parsing=False).items():
        if key not in QUERY_KEYS:
            raise CoordinatorError(
                f"coordinator URL: unknown parameter {key!r} (known: {', '.join(QUERY_KEYS)})"
            )
        if len(values) != 1 or not values[0]:
            raise CoordinatorError(f"coordinator URL: {key} needs one value")
        params[key] = values[0]
    if query and not params:
        raise CoordinatorError(f"coordinator URL: cannot read the parameters {query!r}")
    return base, params


def read_credentials(path: str) -> str:
    """``user:password`` from ``path``; CoordinatorError if it is missing, open or malformed."""
    try:
        text = read_secret(path, "ZooKeeper credentials file")
    except SecretFileError as e:
        raise CoordinatorError(str(e)) from e
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    user, sep, password = (lines[0] if len(lines) == 1 else "").partition(":")
    if not (user and sep and password):
        raise CoordinatorError(
            f"ZooKeeper credentials file {path} must hold one line 'user:password'"
        )
    return f"{user}:{password}"
