"""Custom debug logic: a user bolt run by the debug worker over the mirrored tuples.

Paper §4: the debug worker may run the user's own code on the copies the switch
made, not only show them.  ``typhoon debug attach --operator module:Class``
names a bolt; the debug worker resolves it like a worker resolves its node's
operator (``typhoon.operators.resolve_operator``: built-in names, or
``module:Class`` imported from the host's own files), builds it without
arguments, and feeds it every tuple that passed the filter and the sampling.
What it emits becomes the records shown, in place of the tuples themselves.

Whether the name may be imported at all is decided by the controller, with the
gate every REST request goes through (``typhoon.operators.import_refusal``).
Here, a bolt that raises is counted (``op_errors``, the last message kept in
``op_error``) and the next tuple goes on; it never stops the debug worker.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from typhoon.debug.records import json_safe
from typhoon.operators import Context, Operator, OperatorError, resolve_operator

log = logging.getLogger(__name__)


def load_bolt(name: str) -> type[Operator]:
    """The class ``name`` names, if it is a bolt; OperatorError (one sentence) otherwise."""
    cls = resolve_operator(name, engine="python")  # a function is refused, not sent to Spark
    if cls.kind != "bolt":
        raise OperatorError(
            f"operator '{name}' is a {cls.kind}, not a bolt: the debugger feeds it tuples"
        )
    return cls


def _shown(value: Any) -> Any:
    """A value as the records carry it: JSON, or its repr when JSON has no form for it."""
    safe = json_safe(value)
    try:
        json.dumps(safe)
    except (TypeError, ValueError):
        return repr(value)
    return safe


class DebugOperator:
    """One instance of the user's bolt and what it did: tuples in, records out, errors."""

    def __init__(self, name: str, cls: type[Operator], app: str, session: str) -> None:
        self.name = name
        self.label = f"op:{name.rpartition(':')[2]}"
        try:
            self.bolt = cls()
        except Exception as e:  # user code: any exception is its failure to build
            raise OperatorError(
                f"operator '{name}' cannot be built without arguments ({type(e).__name__}: {e})"
            ) from None
        self.context = Context(app, f"debug-{session}", -1, 0, 1, operator=name)
        try:
            self.bolt.open(self.context)
        except Exception as e:
            raise OperatorError(
                f"operator '{name}' failed to open ({type(e).__name__}: {e})"
            ) from None
        self.output: dict[tuple[str, ...], list[str]] = {}  # input fields -> output fields
        self.tuples_in = self.emitted = self.errors = 0
        self.error = ""

    @classmethod
    def load(cls, name: str, app: str, session: str) -> DebugOperator:
        return cls(name, load_bolt(name), app, session)

    def _fields(self, input_fields: list[str]) -> list[str]:
        key = tuple(input_fields)
        if key not in self.output:
            try:
                self.output[key] = list(type(self.bolt).output_fields({}, list(input_fields)))
            except Exception:  # the names are a courtesy: values are shown without them
                self.output[key] = []
        return self.output[key]

    def run(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The records of what the bolt emitted for ``records`` (raw frames pass unchanged)."""
        out: list[dict[str, Any]] = []
        for record in records:
            if "values" not in record:
                out.append(record)
                continue
            emitted: list[tuple[list, str]] = []

            def emit(values: Any, stream: str = "default", _into: list = emitted) -> None:
                _into.append((list(values), stream))

            self.tuples_in += 1
            try:
                self.bolt.process(list(record["values"]), emit)
            except Exception as e:  # counted, shown in the statistics; the next tuple goes on
                self.errors += 1
                self.error = f"{type(e).__name__}: {e}"[:300]
                if self.errors == 1:
                    log.warning("operator %s raised on %s: %s", self.name, record, self.error)
            names = self._fields(list(record.get("fields") or {}))
            for values, stream in emitted:
                self.emitted += 1
                shown = [_shown(v) for v in values]
                new = {k: v for k, v in record.items() if k not in ("fields", "values")}
                new.update(
                    dst=None,
                    dst_label=self.label,
                    fields=dict(zip(names, shown, strict=False)),
                    values=shown,
                )
                if stream != "default":
                    new["op_stream"] = str(stream)
                out.append(new)
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "op_tuples": self.tuples_in,
            "op_emitted": self.emitted,
            "op_errors": self.errors,
            "op_error": self.error,
        }

    def close(self) -> None:
        try:
            self.bolt.close()
        except Exception as e:
            log.warning("operator %s failed to close: %s: %s", self.name, type(e).__name__, e)
