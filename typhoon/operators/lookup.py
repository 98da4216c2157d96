"""``lookup``: enrich tuples from a static CSV table (a stream-table join on a fixed table).

The ad-analytics pipeline maps each ad to its campaign before counting per
campaign (``topologies/ad_analytics_native.yaml``); any pipeline that joins a
stream with a small reference table does the same.  The table is read once per
worker in ``open()``, so the file must be where every worker runs (a path
relative to the working directory, as for ``file_source``).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from typhoon.operators.base import Bolt, Context, Emit


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a field or column name")
    return value


def read_table(path: str | Path, key: str, value: str) -> dict[str, str]:
    """``key`` column -> ``value`` column of a CSV file with a header row; a clear error if not."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in (key, value) if c not in header]
            if missing:
                raise ValueError(f"lookup table '{path}' has no column {missing[0]!r} ({header})")
            return {row[key]: row[value] for row in reader}
    except OSError as e:
        raise ValueError(f"lookup table '{path}' cannot be read ({e.strerror or e})") from e
    except csv.Error as e:
        raise ValueError(f"lookup table '{path}' is not CSV ({e})") from e


class Lookup(Bolt):
    """Appends ``table[tuple[field]]`` as the field ``to`` (default: ``value_column``).

    Args: ``table`` (CSV path with a header row), ``field`` (input field whose
    value is looked up, as text), ``key_column`` (default ``field``),
    ``value_column``.  A tuple whose value is not in the table is dropped and
    counted (``lookup_miss``): an inner join, and no silent loss.
    """

    def __init__(
        self,
        table: str,
        field: str,
        value_column: str,
        key_column: str | None = None,
        to: str | None = None,
    ) -> None:
        _name(table, "table")
        _name(field, "field")
        _name(value_column, "value_column")
        if key_column is not None:
            _name(key_column, "key_column")
        if to is not None:
            _name(to, "to")
        super().__init__(
            table=table, field=field, value_column=value_column, key_column=key_column, to=to
        )
        self.path, self.field = table, field
        self.key_column, self.value_column = key_column or field, value_column
        self.table: dict[str, str] = {}
        self.index = 0
        self.miss = 0

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        field = args.get("field")
        if field not in input_fields:
            raise ValueError(
                f"lookup field '{field}' is not one of the input fields {input_fields}"
            )
        to = args.get("to") or args.get("value_column")
        if to in input_fields:
            raise ValueError(f"lookup output field '{to}' is already an input field (set 'to')")
        return [*input_fields, to]

    def open(self, context: Context) -> None:
        super().open(context)
        self.index = context.input_fields.index(self.field)
        self.table = read_table(self.path, self.key_column, self.value_column)

    def process(self, values: list, emit: Emit) -> None:
        v = values[self.index]
        found = self.table.get(v if type(v) is str else str(v))
        if found is None:
            self.miss += 1
            return
        emit([*values, found])

    def metrics(self) -> dict[str, Any]:
        return {"lookup_miss": self.miss}

    def snapshot(self) -> dict[str, int]:
        return {"miss": self.miss}

    def restore(self, state: Any) -> None:
        self.miss = int(state["miss"])

    def result(self) -> dict[str, int]:
        return {"miss": self.miss}

    @classmethod
    def merge_results(cls, results: list[Any]) -> dict[str, int]:
        return {"miss": sum(r["miss"] for r in results)}
