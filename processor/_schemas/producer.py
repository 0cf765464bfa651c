"""A record producer that frames each record as its topic's wire format says."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from processor._engine.records import OutboxRow
from processor._errors import SendFailure
from processor._ports.consumer import RecordProducer
from processor._schemas.resolver import SchemaResolver

__all__ = ["FramingProducer"]


class FramingProducer:
    """:class:`processor._ports.RecordProducer` that frames records for registry topics.

    The rows keep our JSON (the outbox, the console and the dead letters show it); only what
    goes to the broker is framed. A row whose value does not fit its schema fails permanently,
    as a record the broker refuses does, with the reason.

    Args:
        inner: The producer that sends.
        resolver: Registers or looks up each written schema once.
    """

    def __init__(self, inner: RecordProducer, resolver: SchemaResolver) -> None:
        self._inner = inner
        self._resolver = resolver

    def send(self, records: Sequence[OutboxRow], timeout: float) -> list[SendFailure]:
        # Raises Retryable while the registry is away: every row stays for the next round.
        self._resolver.prepare_out(records)
        wire = self._resolver.wire
        failures: list[SendFailure] = []
        framed: list[OutboxRow] = []
        positions: list[int] = []
        for index, row in enumerate(records):
            try:
                value = wire.frame(row)
            except Exception as e:  # the encoder's: the value does not fit the schema
                failures.append(
                    SendFailure(
                        index, f"the value does not fit its schema: {type(e).__name__}", True
                    )
                )
                continue
            framed.append(row if value is row.value else dataclasses.replace(row, value=value))
            positions.append(index)
        for f in self._inner.send(framed, timeout):
            failures.append(SendFailure(positions[f.index], f.reason, f.permanent))
        failures.sort(key=lambda f: f.index)
        return failures

    def close(self, timeout: float) -> None:
        self._inner.close(timeout)
        self._resolver.close()
