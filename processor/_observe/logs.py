"""Log lines as text for a terminal or JSON for a log pipeline (``SAGA_LOG_FORMAT``).

The library only logs; :func:`configure_logging` is for the application's entrypoint (the
command line calls it). Every line carries the replica's name; lines about one saga or record
carry its ids as ``extra=`` fields (see :data:`FIELDS`), which the JSON format emits as keys
and the text format leaves to the message (it already names them).
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pythonjsonlogger.json import JsonFormatter

from processor._wire import parse_traceparent

__all__ = [
    "FIELDS",
    "ContextFilter",
    "configure_logging",
    "log_context",
    "set_replica",
    "trace_id",
]

FIELDS = (
    "saga_type",
    "saga_id",
    "message_id",
    "topic",
    "partition",
    "offset",
    "trace_id",
)
"""The ids a line may carry, as ``extra=`` fields or through :data:`log_context`."""

log_context: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "saga_log_context", default=None
)
"""Ids that apply to every line logged in the current context (a thread, a task)."""

_replica: list[str] = ["-"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(threadName)s: %(message)s"


def utc_time(record: logging.LogRecord) -> str:
    """The record's time as ISO-8601 in UTC with milliseconds: comparable across replicas."""
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


class UtcFormatter(logging.Formatter):
    """The text format, its time in ISO-8601 UTC (see :func:`utc_time`)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """ISO-8601 in UTC, whatever the machine's zone."""
        return utc_time(record)


class UtcJsonFormatter(JsonFormatter):
    """The JSON format, its ``time`` in ISO-8601 UTC (see :func:`utc_time`)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """ISO-8601 in UTC, whatever the machine's zone."""
        return utc_time(record)


def set_replica(name: str) -> None:
    """Names the replica on every line from now on (the processor calls it when it starts)."""
    _replica[0] = name


def trace_id(traceparent: str | None) -> str | None:
    """The trace id of a ``traceparent`` header; None when missing or invalid."""
    parsed = parse_traceparent(traceparent)
    return None if parsed is None else parsed[0]


class ContextFilter(logging.Filter):
    """Adds ``replica`` and the :data:`log_context` ids to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Sets the fields; never drops a record."""
        record.replica = _replica[0]
        context = log_context.get()
        if context:
            for key, value in context.items():
                if not hasattr(record, key):
                    setattr(record, key, value)
        return True


def configure_logging(level: str = "INFO", fmt: Literal["text", "json"] = "text") -> None:
    """Sends the root logger's lines to stderr as text or JSON lines.

    Args:
        level: The root logger's level name.
        fmt: ``text`` (the default, for a terminal) or ``json`` (one object per line with
            ``time``, ``level``, ``logger``, ``message``, ``replica`` and the ids in
            :data:`FIELDS` where known).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    if fmt == "json":
        handler.setFormatter(
            UtcJsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s %(replica)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                timestamp=False,
            )
        )
    else:
        handler.setFormatter(UtcFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The Schema Registry client's HTTP library logs every request at INFO: one line per schema
    # fetched says nothing an operator needs (the resolver logs what goes wrong).
    for chatty in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))
