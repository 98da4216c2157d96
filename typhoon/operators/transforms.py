"""Built-in stateless bolts."""

from __future__ import annotations

from typing import Any, ClassVar

from typhoon.operators.base import Bolt, Context, Emit


def _field_index(fields: list[str], name: str, what: str) -> int:
    if name not in fields:
        raise ValueError(f"{what} field '{name}' is not one of the input fields {fields}")
    return fields.index(name)


class SplitWords(Bolt):
    """``[sentence]`` -> one ``[word]`` per whitespace-separated word."""

    fields: ClassVar[tuple[str, ...]] = ("word",)

    def process(self, values: list, emit: Emit) -> None:
        for w in values[0].split():
            emit([w])


class Identity(Bolt):
    """Passes every tuple on unchanged (fields too)."""

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        return list(input_fields)

    def process(self, values: list, emit: Emit) -> None:
        emit(values)


class Filter(Bolt):
    """Passes tuples whose ``field`` equals ``equals`` or is in ``values``."""

    def __init__(self, field: str, equals: Any = None, values: list | None = None) -> None:
        if not isinstance(field, str):
            raise ValueError("field must be a field name")
        if (equals is None) == (values is None):
            raise ValueError("give exactly one of 'equals' or 'values'")
        if values is not None and not isinstance(values, list):
            raise ValueError("values must be a list")
        super().__init__(field=field, equals=equals, values=values)
        self.field = field
        self.accept = frozenset([equals] if values is None else values)
        self.index = 0

    @classmethod
    def output_fields(cls, args: dict[str, Any], input_fields: list[str]) -> list[str]:
        _field_index(input_fields, args.get("field", ""), "filter")
        return list(input_fields)

    def open(self, context: Context) -> None:
        super().open(context)
        self.index = _field_index(context.input_fields, self.field, "filter")

    def process(self, values: list, emit: Emit) -> None:
        if values[self.index] in self.accept:
            emit(values)
