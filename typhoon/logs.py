"""One logging setup for every Typhoon process (CLI, agent, workers, Spark driver).

``TYPHOON_LOG_FORMAT=json`` (or ``typhoon --log-format json``, which sets it for
the processes a run starts) makes every record one JSON object per line, for
log shippers; the default is plain text.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

FORMATS = ("text", "json")
ENV = "TYPHOON_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, process, message (+ exception)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "process": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "",
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def log_format(fmt: str | None = None) -> str:
    """``fmt``, else ``$TYPHOON_LOG_FORMAT``, else text; ValueError for anything else."""
    chosen = fmt or os.environ.get(ENV) or "text"
    if chosen not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {chosen!r}")
    return chosen


def setup(
    level: int = logging.INFO, fmt: str | None = None, text_format: str = TEXT_FORMAT
) -> None:
    """Configure the root logger once per process (``logging.basicConfig`` semantics)."""
    handler = logging.StreamHandler()
    if log_format(fmt) == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(text_format))
    logging.basicConfig(level=level, handlers=[handler])
