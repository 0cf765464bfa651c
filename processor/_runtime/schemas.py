"""Fetches and registers the schemas a batch needs before its records are translated.

And :class:`FramingProducer`, which frames what the relay sends.

Inbound, the schema of every framed record's id is fetched once (ids never change meaning);
outbound, the id of each (topic, message type, version) written is registered or looked up once.
Both raise ``Retryable`` while the registry is away: the consumer treats that as it treats a
database outage (the batch is read again later, its partitions given back past the bound), and
the relay tries its round again. A record whose id the registry does not hold is dead-lettered.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from processor._engine.records import OutboxRow, Record
from processor._errors import Retryable, SchemaRefused, SendFailure
from processor._ports.consumer import RecordProducer
from processor._ports.registry import SchemaRegistry
from processor._schemas.codec import Wire

__all__ = ["FramingProducer", "SchemaResolver"]

log = logging.getLogger(__name__)

# Waits between tries of a registry that failed: short at first, then at most this long. The
# consumer reads its batch again after each failed try; the wait keeps that from spinning.
MAX_BACKOFF = 2.0


class SchemaResolver:
    """The registry's side of :class:`~processor._schemas.codec.Wire`.

    Args:
        wire: The codec it teaches.
        client: The registry.
        auto_register: Register a written schema the first time; else only look it up.
    """

    def __init__(
        self,
        wire: Wire,
        client: SchemaRegistry,
        *,
        auto_register: bool,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.wire = wire
        self._client = client
        self._auto_register = auto_register
        self._clock = clock
        self._sleep = sleep
        self._backoff = 0.0
        self._retry_at = 0.0
        self._down_since: float | None = None
        self.failures = 0
        """Registry calls that failed since start (a metric)."""

    @property
    def down_for(self) -> float:
        """Seconds the registry has been failing; 0 when it answers."""
        return 0.0 if self._down_since is None else self._clock() - self._down_since

    def _paced(self, call: Callable[[], None]) -> None:
        wait = self._retry_at - self._clock()
        if wait > 0:
            self._sleep(wait)
        try:
            call()
        except Retryable as e:
            self.failures += 1
            now = self._clock()
            if self._down_since is None:
                self._down_since = now
                log.warning("%s; waiting for the schema registry", e)
            self._backoff = min(MAX_BACKOFF, max(0.2, self._backoff * 2))
            self._retry_at = now + self._backoff
            raise
        if self._down_since is not None:
            log.info("schema registry answers again after %.1f s", self.down_for)
        self._down_since = None
        self._backoff = self._retry_at = 0.0

    def prepare_in(self, records: Sequence[Record]) -> None:
        """Learns the schema of every framed record's id not yet known.

        Raises:
            Retryable: The registry could not be reached.
        """
        unknown = self.wire.unknown_ids(records)
        if unknown:
            self._paced(lambda: self._fetch(sorted(unknown)))

    def _fetch(self, ids: list[int]) -> None:
        for schema_id in ids:
            schema = self._client.fetch(schema_id)
            if schema is None:
                log.warning("schema id %d is not in the registry %s", schema_id, self._client.url)
            self.wire.learn(schema_id, schema)

    def prepare_out(self, rows: Sequence[OutboxRow]) -> None:
        """Learns the id of every framed row's schema not yet known.

        Raises:
            Retryable: The registry could not be reached, refused the schema, or (without
                auto-registration) does not hold it: the rows wait, in order, until it does.
        """
        keys = self.wire.unregistered(rows)
        if keys:
            self._paced(lambda: self._register(keys))

    def _register(self, keys: list[tuple[str, str, str]]) -> None:
        for key in dict.fromkeys(keys):
            topic, name, version = key
            writer = self.wire.writer(topic, name, int(version) if version else None)
            assert writer is not None
            try:
                found = (
                    self._client.register(writer)
                    if self._auto_register
                    else self._client.lookup(writer)
                )
            except SchemaRefused as e:
                # A deploy that skipped `saga-processor schemas check`: nothing is sent, nothing
                # lost; the rows wait for a compatible schema or an operator.
                raise Retryable(f"{e}; the {name} records for {topic} wait") from None
            if found is None:
                raise Retryable(
                    f"the schema of {name} v{version or '?'} is not registered under "
                    f"{writer.subject}: run `saga-processor schemas register`; its records wait"
                )
            self.wire.learn_writer(key, found)

    def close(self) -> None:
        self._client.close()


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
