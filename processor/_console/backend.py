"""What the console's pages and actions reach: the database, the broker and the saga classes.

Built once from the processor's settings. Each request opens its own autocommit connection
(the console is for people: a handful of requests a minute), so a slow query never holds
another page.
"""

from __future__ import annotations

import getpass
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from processor._authoring.application import SagaApp
from processor._authoring.definition import definition_of
from processor._authoring.orchestration import MachineSaga, MachineSpec
from processor._bootstrap.adapters import Adapters, InspectQueries
from processor._errors import SagaDefinitionError, SagaError
from processor._ports import FailedOutboxRow, RecordProducer
from processor._ports.cluster import ClusterView, with_lag
from processor._ports.views import AuditRow, ConsumerLag, TimelineEntry, consumer_lag
from processor._runtime.assembly import load_saga_classes, operator_key
from processor._wire import OperatorAction
from processor.ops._batch import BatchSent, Selection, select, send_batch
from processor.ops._inspect import (
    purge_dead_letters,
    replay_dead_letter,
    send_operator_request,
    wait_for_outcome,
)
from processor.ops._outbox import discard_failed_rows, retry_failed_rows
from processor.settings import ProcessorSettings

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
        self._adapters = Adapters(settings)
        self._lock = threading.Lock()
        self._producer: RecordProducer | None = None

    @contextmanager
    def inspect(self) -> Iterator[InspectQueries]:
        """Read queries on a connection of their own, closed on leaving."""
        with self._adapters.inspect_queries() as queries:
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
        with self.inspect() as queries:
            stored = queries.stored_offsets(self.settings.consumer.group_id)
        marks = self._adapters.watermarks(stored, timeout)
        return None if marks is None else consumer_lag(stored, marks)

    # -- the cluster page and the probes --------------------------------------------------------

    def cluster(self, timeout: float = 3.0) -> ClusterView:
        """Replicas, partitions with owners and lag, the deadline lease and the relay's backlog.

        The lag is unknown (None) when the broker does not answer within ``timeout`` seconds.
        """
        view = self._adapters.cluster_view()
        stored = {(p.topic, p.partition): p.stored for p in view.partitions}
        marks = self._adapters.watermarks(stored, timeout)
        return with_lag(view, None if marks is None else consumer_lag(stored, marks))

    def database_answers(self) -> bool:
        """Whether the database takes a connection and answers a query (the readiness probe)."""
        return self._adapters.database_answers()

    def route(self) -> Callable[[str, bytes, int], int]:
        """Routes operator records to where a saga's events go now (input topics may grow)."""
        return self._adapters.router()

    def producer(self) -> RecordProducer:
        """One producer for the console's operator records, made on first use."""
        with self._lock:
            if self._producer is None:
                self._producer = self._adapters.record_producer()
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
        *,
        actor: str | None = None,
    ) -> str:
        """Sends an operator record into the saga's partition; returns its message id.

        ``actor`` is who asks (the console's signed-in identity); the process's operator name
        when None.
        """
        with self.inspect() as queries:
            sent = send_operator_request(
                queries,
                self.producer(),
                operator_key(self.settings),
                action=action,
                saga_type=saga_type,
                saga_id=saga_id,
                by=actor or self.by,
                reason=reason,
                name=name,
                route=self.route(),
            )
        return sent.message_id

    def retry_parked(
        self,
        saga_type: str,
        saga_id: str,
        reason: str,
        skip: int,
        timeout: float = 30.0,
        *,
        actor: str | None = None,
    ) -> tuple[TimelineEntry | None, str | None]:
        """Asks the processor to replay a parked saga (``skip``: drop its failing message first).

        The request is an operator record in the saga's partition, like a cancel; this waits up
        to ``timeout`` seconds for the processor's outcome.

        Returns:
            The request's timeline entry (None if no processor applied it in time) and the
            saga's status afterwards.
        """
        action = OperatorAction.PARKED_SKIP if skip else OperatorAction.PARKED_RETRY
        message_id = self.request(action, saga_type, saga_id, reason, actor=actor)
        return self.outcome(saga_type, saga_id, message_id, timeout)

    def outcome(
        self, saga_type: str, saga_id: str, message_id: str, timeout: float = 30.0
    ) -> tuple[TimelineEntry | None, str | None]:
        """Waits up to ``timeout`` seconds for the outcome of the request sent as ``message_id``.

        Returns:
            The request's timeline entry (None if no processor applied it in time) and the
            saga's status afterwards.
        """
        with self.inspect() as queries:
            entry = wait_for_outcome(queries, saga_type, saga_id, message_id, timeout)
            summary, _ = queries.saga(saga_type, saga_id)
        return entry, summary.status

    def replay_dead_letter(
        self, row_id: int, *, actor: str | None = None, reason: str | None = None
    ) -> None:
        """Sends a dead letter back to its source partition and deletes it.

        The replay is recorded in the audit trail with the delete: ``actor`` (the signed-in
        user; the process's operator name when None) and ``reason``.
        """
        with self.inspect() as queries:
            replay_dead_letter(
                queries, self.producer(), row_id, actor=actor or self.by, reason=reason
            )

    def purge_dead_letter(
        self, row_id: int, *, actor: str | None = None, reason: str | None = None
    ) -> None:
        """Deletes a dead letter for good, recording who (``actor``) and why in the audit trail."""
        with self.inspect() as queries:
            gone = purge_dead_letters(queries, actor=actor or self.by, reason=reason, ids=[row_id])
        if gone == 0:
            raise SagaError(f"no dead letter {row_id}")

    def failed_outbox(self, limit: int) -> list[FailedOutboxRow]:
        """Failed and held outbox rows in their order."""
        with self._adapters.failed_outbox() as store:
            return store.list_failed(None, None, limit)

    def outbox_action(
        self, row_id: int, retry: bool, reason: str, *, actor: str | None = None
    ) -> list[FailedOutboxRow]:
        """Retries (puts back, with its saga's held rows) or discards a failed outbox row.

        Either is recorded in the audit trail in its transaction, with ``actor`` (the signed-in
        user; the process's operator name when None) and ``reason``.
        """
        who = actor or self.by
        with self._adapters.failed_outbox() as store:
            if retry:
                return retry_failed_rows(store, row_id=row_id, actor=who, reason=reason)
            return discard_failed_rows(store, reason=reason, row_id=row_id, actor=who)

    def audit(
        self,
        limit: int,
        saga_type: str | None = None,
        saga_id: str | None = None,
        batch: str | None = None,
    ) -> list[AuditRow]:
        """Recorded operator actions, newest first; of one saga (type, or type and id), or batch."""
        with self.inspect() as queries:
            return queries.audit(saga_type=saga_type, saga_id=saga_id, limit=limit, batch=batch)

    # -- batches -------------------------------------------------------------------------------

    def batch_select(self, action: str, where: Mapping[str, str], limit: int) -> Selection:
        """The sagas a batch of ``action`` would touch (see :func:`processor.ops._batch.select`)."""
        with self.inspect() as queries:
            return select(queries, action, where, limit)

    def batch_send(
        self, selection: Selection, reason: str, *, actor: str | None = None
    ) -> BatchSent:
        """Records the batch and sends its requests; does not wait for their outcomes."""
        with self.inspect() as queries:
            return send_batch(
                queries,
                self.producer(),
                operator_key(self.settings),
                selection,
                by=actor or self.by,
                reason=reason,
                route=self.route(),
            )
