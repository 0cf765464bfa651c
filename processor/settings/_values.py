"""Value types the settings share: durations written as people write them, SQL identifiers."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator

__all__ = [
    "Duration",
    "check_identifier",
    "parse_duration",
]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def parse_duration(value: Any) -> Any:
    """Accepts `30s`, `2m`, `250ms`, `1.5h`, ISO 8601 (`PT30S`), seconds, or a timedelta."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            if value.strip().upper().startswith("P"):
                return value  # ISO 8601 (e.g. PT30S): pydantic parses it
            raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 2m, 250ms)")
        return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    return value


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def check_identifier(value: str) -> str:
    """``value`` if it is a plain lower-case SQL identifier (a schema or table name).

    Raises:
        ValueError: It is not.
    """
    if not _IDENTIFIER.match(value):
        raise ValueError(f"{value!r} is not a plain lower-case SQL identifier")
    return value
