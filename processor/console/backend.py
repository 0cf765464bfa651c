"""What the console's pages and actions reach: the database, the broker and the saga classes.

Built once from the processor's settings. Each request opens its own autocommit connection
(the console is for people: a handful of requests a minute), so a slow query never holds
another page.
"""

from __future__ import annotations

import getpass
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from processor.application import SagaApp
from processor.definition import definition_of
from processor.errors import SagaDefinitionError, SagaError
from processor.machine import MachineSaga, MachineSpec
from processor.ops.inspect import replay_dead_letter, send_operator_request, wait_for_outcome
from processor.ops.outbox import discard_failed_rows, retry_failed_rows
from processor.ops.views import ConsumerLag, TimelineEntry, consumer_lag
from processor.ports import FailedOutboxRow, RecordProducer
from processor.postgres.connect import connect
from processor.postgres.failed_outbox import PostgresFailedOutbox
from processor.postgres.inspect import InspectQueries, open_inspect_queries
from processor.runtime.assembly import load_saga_classes, operator_key, tables_for
from processor.settings import ProcessorSettings
from processor.wire import OperatorAction

__all__ = ["Backend"]


class Backend:
    """The console's access to the processor's world.

    Args:
        settings: The processor's settings (database, broker, sagas, operator key).
        by: The name recorded as who asked, next to the person's own note.
        app: The application object, whose sagas the diagrams draw (else `SAGA_SAGAS`).
    """

    def __init__(
        self, settings: ProcessorSettings, by: str | None = None, app: SagaApp | None = None
    ) -> None:
        self.settings = settings
        self.app = app
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
    def saga_classes(self) -> list[type[Any]]:
        """The saga classes the processor runs: the app's, else those `SAGA_SAGAS` names."""
        if self.app is not None:
            return list(self.app.sagas)
        return load_saga_classes(self.settings.sagas)

    def machine(self, saga_type: str) -> MachineSpec | None:
        """The state machine of ``saga_type``, or None when it is not a machine saga."""
        for cls in self.saga_classes:
            if not (isinstance(cls, type) and issubclass(cls, MachineSaga)):
                continue
            try:
                if definition_of(cls).saga_type == saga_type:
                    return cls.machine_spec()
            except SagaDefinitionError:
                continue
        return None

    def consumer_lag(self, timeout: float = 3.0) -> ConsumerLag | None:
        """Stored positions against the broker's high watermarks; None if the broker is away."""
        from processor.kafka.watermarks import watermarks

        with self.inspect() as queries:
            stored = queries.stored_offsets(self.settings.consumer.group_id)
        marks = watermarks(self.settings.kafka.client_config(), stored, timeout)
        return None if marks is None else consumer_lag(stored, marks)

    def route(self) -> Callable[[str, bytes, int], int]:
        """Routes operator records to where a saga's events go now (input topics may grow)."""
        from processor.postgres.connect import connect
        from processor.postgres.growth import current_router

        cs = self.settings.consumer
        return current_router(lambda: connect(self._url), self._tables, cs.group_id, cs.partitioner)

    def producer(self) -> RecordProducer:
        """One producer for the console's operator records, made on first use."""
        from processor.kafka.producer import KafkaRecordProducer, make_producer

        with self._lock:
            if self._producer is None:
                config = self.settings.kafka.client_config()
                part = self.settings.consumer.partitioner
                self._producer = KafkaRecordProducer(
                    lambda: make_producer(config, partitioner=part)
                )
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
                route=self.route(),
            )
        return sent.message_id

    def retry_parked(
        self, saga_type: str, saga_id: str, reason: str, skip: int, timeout: float = 30.0
    ) -> tuple[TimelineEntry | None, str | None]:
        """Asks the processor to replay a parked saga (``skip``: drop its failing message first).

        The request is an operator record in the saga's partition, like a cancel; this waits up
        to ``timeout`` seconds for the processor's outcome.

        Returns:
            The request's timeline entry (None if no processor applied it in time) and the
            saga's status afterwards.
        """
        action = OperatorAction.PARKED_SKIP if skip else OperatorAction.PARKED_RETRY
        return self.act(action, saga_type, saga_id, reason, timeout=timeout)

    def act(
        self,
        action: OperatorAction,
        saga_type: str,
        saga_id: str,
        reason: str,
        name: str | None = None,
        timeout: float = 30.0,
    ) -> tuple[TimelineEntry | None, str | None]:
        """Sends an operator request and waits up to ``timeout`` seconds for its outcome.

        Returns:
            The request's timeline entry (None if no processor applied it in time) and the
            saga's status afterwards.
        """
        message_id = self.request(action, saga_type, saga_id, reason, name)
        with self.inspect() as queries:
            entry = wait_for_outcome(queries, saga_type, saga_id, message_id, timeout)
            summary, _ = queries.saga(saga_type, saga_id)
        return entry, summary.status

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
