"""``postgres_sink``: tuples into a PostgreSQL table, upserted by key or appended.

Under ``exactly_once`` it is a transactional sink (typhoon.operators.connectors):
the rows of the epochs a global checkpoint completed go in in one transaction
that also records the newest epoch in ``typhoon_sink_epochs`` (one row per sink
worker), so a replayed epoch is recognised and never written twice.  Otherwise
rows go in batches, each its own transaction.  Lost connections are retried with
backoff; statements are built with ``psycopg.sql`` (no string formatting).
"""

from __future__ import annotations

import logging
from typing import Any

from typhoon.operators.base import Context
from typhoon.operators.connectors import ConnectorError, TransactionalSink, epochs_after, retry

log = logging.getLogger(__name__)

EPOCHS_TABLE = "typhoon_sink_epochs"
EPOCHS_LOCK = 0x7479_7068_6F6F_6E65  # advisory lock key ("typhoone") for creating that table


def _identifier(name: str) -> Any:
    from psycopg import sql

    return sql.Identifier(*name.split("."))


def insert_statement(table: str, columns: list[str], key: list[str]) -> Any:
    """INSERT of one row; with ``key`` an upsert on those columns (they need a unique index)."""
    from psycopg import sql

    cols = sql.SQL(", ").join(map(sql.Identifier, columns))
    marks = sql.SQL(", ").join(sql.Placeholder() * len(columns))
    stmt = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(_identifier(table), cols, marks)
    if not key:
        return stmt
    rest = [c for c in columns if c not in key]
    conflict = sql.SQL(", ").join(map(sql.Identifier, key))
    if not rest:
        return stmt + sql.SQL(" ON CONFLICT ({}) DO NOTHING").format(conflict)
    sets = sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in rest
    )
    return stmt + sql.SQL(" ON CONFLICT ({}) DO UPDATE SET {}").format(conflict, sets)


def _connect(dsn: str) -> Any:
    import psycopg

    return psycopg.connect(dsn, connect_timeout=5)


def _transient() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.OperationalError,)


class PostgresSink(TransactionalSink):
    """Writes each tuple as a row of ``table`` (columns: the input fields, or ``columns``).

    Args: ``dsn`` (``postgresql://user@host:port/db`` or key=value); ``table`` (it must
    exist); ``key``: columns to upsert on (a unique index over them), or ``append:
    true`` to insert every row.  A tuple whose length is not the column count is
    counted (``wrong_fields``) and left out.
    """

    def __init__(
        self,
        dsn: str,
        table: str,
        key: list[str] | None = None,
        append: bool = False,
        columns: list[str] | None = None,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise ValueError("dsn must be a PostgreSQL connection string")
        if not isinstance(table, str) or not all(table.split(".")) or table.count(".") > 1:
            raise ValueError("table must be a table name (or schema.table)")
        if (key is None) == (append is not True):
            raise ValueError("give either key: [columns] (upsert) or append: true")
        if key is not None and (
            not isinstance(key, list) or not key or not all(isinstance(k, str) for k in key)
        ):
            raise ValueError("key must be a list of column names")
        if columns is not None and (
            not isinstance(columns, list) or not all(isinstance(c, str) and c for c in columns)
        ):
            raise ValueError("columns must be a list of column names")
        super().__init__(dsn=dsn, table=table, key=key, append=append, columns=columns)
        self.dsn, self.table, self.key = dsn, table, list(key or [])
        self.columns = list(columns or [])
        self.stmt: Any = None
        self.sink_name = ""
        self.part = ""

    @classmethod
    def preflight(cls, args: dict[str, Any]) -> None:
        """Submit time: the server answers and the table is there (ConnectorError if not)."""
        dsn, table = args.get("dsn", ""), args.get("table", "")
        where = _redact(dsn)
        try:
            with _connect(dsn) as conn:
                found = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        except Exception as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConnectorError(
                f"postgres_sink: the PostgreSQL server at {where} cannot be used ({reason})"
            ) from None
        if found is None or found[0] is None:
            raise ConnectorError(f"postgres_sink: there is no table '{table}' at {where}")

    def open(self, context: Context) -> None:
        super().open(context)
        if not self.columns:
            self.columns = list(context.input_fields)
        missing = [k for k in self.key if k not in self.columns]
        if missing:
            raise ValueError(
                f"postgres_sink: key {missing} is not among the columns {self.columns}"
            )
        self.stmt = insert_statement(self.table, self.columns, self.key)
        self.sink_name = f"{context.topology}/{context.node}/{self.table}"
        self.part = str(context.index)
        self.conn = retry(f"connecting to {_redact(self.dsn)}", self._open_conn, _transient())

    def _open_conn(self) -> Any:
        conn = _connect(self.dsn)
        if self.two_phase:
            try:
                with conn.transaction():
                    # the sink workers of a new job start together, and two concurrent
                    # CREATE TABLE IF NOT EXISTS can both miss the table and one fail on
                    # the catalog's unique index: the first takes this lock, the rest
                    # wait for its commit and find the table
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (EPOCHS_LOCK,))
                    conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {EPOCHS_TABLE} (sink text NOT NULL,"
                        " part text NOT NULL, epoch bigint NOT NULL, PRIMARY KEY (sink, part))"
                    )
            except BaseException:
                conn.close()
                raise
        return conn

    def _run(self, what: str, work: Any) -> Any:
        """``work(conn)`` in one transaction, again on a new connection after a lost one."""

        def attempt() -> Any:
            if self.conn is None or self.conn.closed:
                self.conn = self._open_conn()
            try:
                with self.conn.transaction():
                    return work(self.conn)
            except _transient():
                self.conn.close()
                self.conn = None
                raise

        return retry(f"{what} on {_redact(self.dsn)}", attempt, _transient(), attempts=10)

    def _rows(self, rows: list[list]) -> list[list]:
        n = len(self.columns)
        good = [r for r in rows if len(r) == n]
        if len(good) != len(rows):
            self.drops.add("wrong_fields", len(rows) - len(good))
        return good

    def write(self, rows: list[list]) -> int:
        good = self._rows(rows)
        if good:
            self._run("writing rows", lambda c: c.cursor().executemany(self.stmt, good))
        return len(good)

    def commit(self, epochs: dict[int, list[list]]) -> int:
        last = max(epochs)

        def work(conn: Any) -> int:
            todo = epochs_after(epochs, self._committed(conn))
            if not todo:
                return 0  # a retry after the commit went through but its answer was lost
            good = self._rows([r for rows in todo.values() for r in rows])
            if good:
                conn.cursor().executemany(self.stmt, good)
            conn.execute(
                f"INSERT INTO {EPOCHS_TABLE} (sink, part, epoch) VALUES (%s, %s, %s)"
                " ON CONFLICT (sink, part) DO UPDATE SET epoch = EXCLUDED.epoch",
                (self.sink_name, self.part, last),
            )
            return len(good)

        return self._run(f"committing epoch {last}", work)

    def _committed(self, conn: Any) -> int | None:
        row = conn.execute(
            f"SELECT epoch FROM {EPOCHS_TABLE} WHERE sink = %s AND part = %s",
            (self.sink_name, self.part),
        ).fetchone()
        return None if row is None else int(row[0])

    def committed_epoch(self) -> int | None:
        return self._run("reading the committed epoch", self._committed)

    def reset(self) -> None:
        self._run(
            "clearing the committed epoch",
            lambda c: c.execute(
                f"DELETE FROM {EPOCHS_TABLE} WHERE sink = %s AND part = %s",
                (self.sink_name, self.part),
            ),
        )


def _redact(dsn: str) -> str:
    """The DSN without a password, for messages."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:
        return "(an unreadable dsn)"
    host, port, db = parts.get("host", "localhost"), parts.get("port", "5432"), parts.get("dbname")
    return f"{host}:{port}" + (f"/{db}" if db else "")
