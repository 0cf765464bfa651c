"""Publishes outbox rows to Kafka, in order per saga, at least once.

A round: take a transaction-scoped advisory lock (one publishing relay at a time across
replicas, so a saga's row n+1 can never overtake row n in another process), delete up to
batch-size rows in id order, produce them, wait for every acknowledgement, then commit. Any
failure rolls the delete back and the rows are sent again later under the same message ids.
Rows are claimed by what is committed, never by "id > last seen", so a row committed late by a
slower transaction is not skipped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer

from processor.postgres.schema import Tables
from processor.postgres.store import Conn

log = logging.getLogger(__name__)


class DeliveryFailed(Exception):
    def __init__(self, errors: list[KafkaError]) -> None:
        self.errors = errors
        super().__init__(f"{len(errors)} records not acknowledged; first: {errors[0]}")


class Relay:
    """`run_once()` publishes one round; `run()` loops until stopped."""

    def __init__(
        self,
        *,
        connect: Callable[[], Conn],
        tables: Tables,
        producer_factory: Callable[[], Producer],
        batch_size: int = 1000,
        poll_interval: float = 1.0,
        flush_timeout: float = 60.0,
    ) -> None:
        self._connect = connect
        self.conn = connect()
        self._producer_factory = producer_factory
        self.producer = producer_factory()
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.flush_timeout = flush_timeout
        self.wake = threading.Event()
        self.published = 0
        # Crash tests kill the process at "after-produce" (acknowledged, rows not yet removed).
        self.fault_hook: Callable[[str], None] = lambda point: None
        self.channel = f"saga_outbox_{tables.schema}"
        self._lock_key = f"saga-relay:{tables.schema}"
        self._claim = tables.render(
            """
            DELETE FROM {outbox} WHERE id IN
                (SELECT id FROM {outbox} ORDER BY id LIMIT %s FOR UPDATE)
            RETURNING id, topic, partition, key, headers, value
            """
        )

    def run_once(self) -> int:
        """Publishes up to batch-size rows; 0 when idle or another relay holds the lock."""
        try:
            with self.conn.transaction():
                locked = self.conn.execute(
                    "SELECT pg_try_advisory_xact_lock(hashtext(%s))", (self._lock_key,)
                ).fetchone()
                if not locked or not locked[0]:
                    return 0
                rows = self.conn.execute(self._claim, (self.batch_size,)).fetchall()
                if rows:
                    # DELETE ... RETURNING has no defined order: restore commit order by id.
                    rows.sort(key=lambda r: r[0])
                    self._publish(rows)
                    self.fault_hook("after-produce")
        except psycopg.OperationalError:
            self._reconnect()
            raise
        self.published += len(rows)
        return len(rows)

    def _publish(self, rows: list[Any]) -> None:
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                errors.append(err)

        try:
            for _id, topic, partition, key, headers, value in rows:
                # The client encodes str header values itself, in C.
                kwargs: dict[str, Any] = {"key": key, "value": value, "headers": headers}
                if partition is not None:
                    kwargs["partition"] = partition
                self._produce(topic, kwargs, delivered)
            # Delivery reports come only for failures (see make_producer): a flush that leaves
            # nothing queued and reported nothing means every record was acknowledged.
            remaining = self.producer.flush(self.flush_timeout)
        except KafkaException as e:
            self._recreate_producer(e)
            raise
        if remaining or errors:
            if any(e.fatal() for e in errors):
                self._recreate_producer(errors[0])
            raise DeliveryFailed(errors or [KafkaError(KafkaError._MSG_TIMED_OUT)])

    def _produce(
        self, topic: str, kwargs: dict[str, Any], on_delivery: Callable[[Any, Any], None]
    ) -> None:
        while True:
            try:
                self.producer.produce(topic, on_delivery=on_delivery, **kwargs)
                return
            except BufferError:
                # Local queue full: let deliveries drain, then go on with the same row.
                self.producer.poll(0.1)

    def _recreate_producer(self, cause: object) -> None:
        # A fatal idempotence error leaves the producer unusable; the rows are still in the
        # outbox (the delete rolls back), so a fresh producer resends them in order.
        log.warning("recreating the relay's producer after: %s", cause)
        self.producer = self._producer_factory()

    def _reconnect(self) -> None:
        try:
            self.conn.close()
        finally:
            self.conn = self._connect()

    def run(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                n = self.run_once()
                failures = 0
            except (DeliveryFailed, KafkaException, psycopg.Error) as e:
                failures += 1
                log.warning("relay round failed (%s); rows stay in the outbox", e)
                stop.wait(min(5.0, 0.2 * 2 ** min(failures, 5)))
                continue
            if n < self.batch_size:
                self.wake.wait(self.poll_interval)
                self.wake.clear()
        self.producer.flush(5)

    def close(self) -> None:
        self.conn.close()


class NotifyListener:
    """Wakes the relay when another process commits outbox rows (LISTEN/NOTIFY)."""

    def __init__(self, connect: Callable[[], Conn], channel: str, wake: threading.Event) -> None:
        self._connect = connect
        self.channel = channel
        self.wake = wake

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                with self._connect() as conn:
                    conn.autocommit = True
                    conn.execute(
                        psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self.channel))
                    )
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.wake.set()
            except psycopg.Error as e:
                log.debug("notify listener reconnecting: %s", e)
                stop.wait(1.0)
