"""Adapter-neutral shapes of what flows in from Kafka and out to the outbox."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

UNREADABLE_HEADER_NAME = "\x00unreadable-headers"
"""Stands for a record's headers when the client could not read them (a name that is not
valid UTF-8). The NUL keeps it apart from every real header name, which may not hold one."""

UNREADABLE_HEADERS: tuple[tuple[str, bytes], ...] = ((UNREADABLE_HEADER_NAME, b""),)


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 0.1 us a
# field), and one is built per event; nothing changes it once built.
@dataclass(slots=True)
class Record:
    """One consumed Kafka record, copied out of the client's message object."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int | None = None

    def header(self, name: str) -> str | None:
        """The last value of header `name` as text (Kafka allows repeats; the last one wins)."""
        found: str | None = None
        for key, value in self.headers:
            if key == name:
                found = value.decode("utf-8", errors="replace")
        return found

    def headers_text(self) -> dict[str, str]:
        """All headers as text, the last value of a repeated header winning."""
        return {k: v.decode("utf-8", errors="replace") for k, v in self.headers}


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 0.1 us a
# field), and one is built per event; nothing changes it once built.
@dataclass(slots=True)
class OutboxRow:
    """A record to publish: a saga's command, a dead letter, or a deadline-fired record.

    ``source`` is the input (topic, partition) whose record caused the row: the relay of that
    partition's owner publishes it. None for rows of no input partition (written by other paths
    or before rows carried it); any relay publishes those, one at a time.
    """

    saga_type: str | None
    saga_id: str | None
    topic: str
    key: bytes | None
    headers: Mapping[str, str]
    value: bytes
    partition: int | None = None
    source: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """A partition's next offset, written only if the epoch and the expected offset still hold."""

    topic: str
    partition: int
    next_offset: int
    expected: int | None
    epoch: int
