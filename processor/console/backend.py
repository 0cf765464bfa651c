"""What the console's pages and actions reach: the database, the broker and the saga classes.

Built once from the processor's settings. Each request opens its own autocommit connection
(the console is for people: a handful of requests a minute), so a slow query never holds
another page.
"""

from __future__ import annotations

import getpass
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property

from processor.errors import SagaError
from processor.machine import MachineSaga, MachineSpec
from processor.ops.inspect import replay_dead_letter, send_operator_request
from processor.ops.outbox import discard_failed_rows, retry_failed_rows
from processor.ops.parked import RetryResult, retry_parked_saga
from processor.ports import FailedOutboxRow, RecordProducer
from processor.postgres.connect import connect
from processor.postgres.failed_outbox import PostgresFailedOutbox
from processor.postgres.inspect import InspectQueries, open_inspect_queries
from processor.postgres.operator import open_operator_queries
from processor.runtime.assembly import BoundSagas, bind_sagas, operator_key, tables_for
from processor.settings import ProcessorSettings
from processor.wire import OperatorAction

__all__ = ["Backend"]


class Backend:
    """The console's access to the processor's world.

    Args:
        settings: The processor's settings (database, broker, sagas, operator key).
        by: The name recorded as who asked, next to the person's own note.
    """

    def __init__(self, settings: ProcessorSettings, by: str | None = None) -> None:
        self.settings = settings
        self.by = by or settings.operator.name or getpass.getuser()
        self._url = settings.database.url.get_secret_value()
        self._tables = tables_for(settings)
        self._lock = threading.Lock()
        self._producer: RecordProducer | None = None

    @contextmanager
    def inspect(self) -> Iterator[InspectQueries]:
        """Read queries on a connection of their own, closed on leaving."""
        with open_inspect_queries(self._url, self._tables) as queries:
            yield queries

    @cached_property
    def bound(self) -> BoundSagas:
        """The sagas the processor runs, bound as it binds them."""
        return bind_sagas(self.settings)

    def machine(self, saga_type: str) -> MachineSpec | None:
        """The state machine of ``saga_type``, or None when it is not a machine saga."""
        bound = self.bound.sagas.get(saga_type)
        if bound is None:
            return None
        cls = bound.definition.state_cls
        return cls.machine_spec() if issubclass(cls, MachineSaga) else None

    def producer(self) -> RecordProducer:
        """One producer for the console's operator records, made on first use."""
        from processor.kafka.producer import KafkaRecordProducer, make_producer

        with self._lock:
            if self._producer is None:
                config = self.settings.kafka.client_config()
                self._producer = KafkaRecordProducer(lambda: make_producer(config))
            return self._producer

    def close(self) -> None:
        """Flushes and closes the producer, if one was made."""
        with self._lock:
            if self._producer is not None:
                self._producer.close(10.0)
                self._producer = None

    # -- actions -------------------------------------------------------------------------------

    def request(
        self,
        action: OperatorAction,
        saga_type: str,
        saga_id: str,
        reason: str,
        name: str | None = None,
    ) -> str:
        """Sends an operator record into the saga's partition; returns its message id."""
        with self.inspect() as queries:
            sent = send_operator_request(
                queries,
                self.producer(),
                operator_key(self.settings),
                action=action,
                saga_type=saga_type,
                saga_id=saga_id,
                by=self.by,
                reason=reason,
                name=name,
            )
        return sent.message_id

    def retry_parked(self, saga_type: str, saga_id: str, reason: str, skip: int) -> RetryResult:
        """Replays a parked saga's held messages (after dropping ``skip`` of them)."""
        with open_operator_queries(self._url, self._tables) as queries:
            return retry_parked_saga(
                queries,
                self.bound.planner,
                saga_type,
                saga_id,
                registry=self.bound.registry,
                max_record_bytes=self.settings.consumer.max_record_bytes,
                skip=skip,
                by=self.by,
                reason=reason,
            )

    def replay_dead_letter(self, row_id: int) -> None:
        """Sends a dead letter back to its source partition and deletes it."""
        with self.inspect() as queries:
            replay_dead_letter(queries, self.producer(), row_id)

    def purge_dead_letter(self, row_id: int) -> None:
        """Deletes a dead letter for good."""
        with self.inspect() as queries:
            if queries.purge_dead_letters([row_id]) == 0:
                raise SagaError(f"no dead letter {row_id}")

    def failed_outbox(self, limit: int) -> list[FailedOutboxRow]:
        """Failed and held outbox rows in their order."""
        with connect(self._url, autocommit=True) as conn:
            return PostgresFailedOutbox(conn, self._tables).list_failed(None, None, limit)

    def outbox_action(self, row_id: int, retry: bool, reason: str) -> list[FailedOutboxRow]:
        """Retries (puts back, with its saga's held rows) or discards a failed outbox row."""
        with connect(self._url, autocommit=True) as conn:
            store = PostgresFailedOutbox(conn, self._tables)
            if retry:
                return retry_failed_rows(store, row_id=row_id)
            return discard_failed_rows(store, reason=reason, row_id=row_id)
