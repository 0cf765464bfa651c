"""Parked sagas: list them, and replay their held messages once the cause is fixed.

A saga is parked when a handler keeps raising; every later message for it is held in
`parked_message` so that nothing overtakes the failed one. A retry replays the held messages in
the order they arrived, through the same planner the consumer uses, in one transaction guarded by
the instance's version: either every message applies and the saga flows again, or nothing
changes and the saga stays parked with the reason of the message that failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from processor.cli import command, ops_connection, saga_key_arguments, text_table
from processor.engine.decode import Rejected, decode
from processor.engine.plan import Item, Planner
from processor.engine.records import Record
from processor.engine.rows import ACTIVE, PARKED, SagaRow, SagaWrite, Wants, WriteSet
from processor.errors import SagaError
from processor.messages import MessageRegistry
from processor.messages import registry as default_registry
from processor.postgres.schema import Tables
from processor.postgres.store import BatchStore, Conn
from processor.settings import ProcessorSettings

__all__ = [
    "NotParked",
    "ParkedSaga",
    "ReplayOutcome",
    "RetryFailure",
    "RetryResult",
    "list_parked",
    "retry_parked",
    "retry_parked_saga",
]


class NotParked(SagaError):
    """The saga instance does not exist or is not parked, so there is nothing to retry."""


@dataclass(frozen=True, slots=True)
class ParkedSaga:
    """A parked saga instance.

    Attributes:
        saga_type: The saga's type name.
        saga_id: The instance id (its association value).
        reason: The error that parked it: handler name, exception type and message.
        held: How many messages wait behind it, the failed one included.
        version: The instance's version; a retry checks it has not moved.
        parked_at: When the instance row last changed.
    """

    saga_type: str
    saga_id: str
    reason: str | None
    held: int
    version: int
    parked_at: datetime


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """What a retry did with one held message (one history row).

    Attributes:
        message_id: The message id, or `deadline:<id>` for a fired deadline.
        message_type: Wire type of the message, or `deadline:<name>`.
        outcome: `applied`, `duplicate`, `no-saga`, `ignored-ended`, `deadline-stale`, ...
        version: The instance version the message produced, when it applied.
        topic: Topic the message was consumed from.
        partition: Its partition.
        offset: Its offset.
    """

    message_id: str
    message_type: str
    outcome: str
    version: int | None
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class RetryFailure:
    """The held message that failed again, and why.

    Attributes:
        parked_id: Id of its `parked_message` row.
        message_id: Its message id header, if it has one.
        topic: Topic it was consumed from.
        partition: Its partition.
        offset: Its offset.
        reason: The handler's error, or why the message could not be replayed.
    """

    parked_id: int
    message_id: str | None
    topic: str
    partition: int
    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class RetryResult:
    """The outcome of one retry.

    Attributes:
        saga_type: The saga's type name.
        saga_id: The instance id.
        held: How many held messages were replayed (or attempted, when it failed).
        status: The instance's status afterwards: `active`, `ended`, still `parked`, or
            `discarded` when it never started and nothing applied (its row is removed).
        outcomes: One entry per history row the replay wrote (empty when it failed).
        dead_lettered: Held messages that no longer decode and went to the dead-letter topic.
        failure: The message that failed again; None when the retry succeeded.
    """

    saga_type: str
    saga_id: str
    held: int
    status: str
    outcomes: tuple[ReplayOutcome, ...] = ()
    dead_lettered: int = 0
    failure: RetryFailure | None = None

    @property
    def ok(self) -> bool:
        """Whether every held message was replayed and the saga left the parked state."""
        return self.failure is None


class _Failed(Exception):
    """Carries the failure out of the transaction so that leaving it rolls everything back."""

    def __init__(self, failure: RetryFailure) -> None:
        super().__init__(failure.reason)
        self.failure = failure


@dataclass(frozen=True, slots=True)
class _Held:
    parked_id: int
    record: Record


_LIST = """
    SELECT i.saga_type, i.saga_id, i.parked_reason, count(p.id), i.version, i.updated_at
      FROM {instance} AS i
      LEFT JOIN {parked} AS p ON p.saga_type = i.saga_type AND p.saga_id = i.saga_id
     WHERE i.status = 'parked'
     GROUP BY i.saga_type, i.saga_id
     ORDER BY i.updated_at, i.saga_type, i.saga_id
     LIMIT %s
"""
# The row lock makes a consumer batch that touches this saga wait for the retry; its version
# check then fails and it replans against the saga as the retry left it.
_LOCK = """
    SELECT state, status, version FROM {instance}
     WHERE saga_type = %s AND saga_id = %s FOR UPDATE
"""
_HELD = """
    SELECT id, topic, partition, "offset", key, value, headers FROM {parked}
     WHERE saga_type = %s AND saga_id = %s ORDER BY id
"""
_RELEASE = "DELETE FROM {parked} WHERE id = ANY(%s::bigint[])"
_DISCARD = "DELETE FROM {instance} WHERE saga_type = %s AND saga_id = %s AND version = %s"


def list_parked(conn: Conn, tables: Tables, limit: int = 100) -> list[ParkedSaga]:
    """Parked saga instances, longest parked first.

    Args:
        conn: A connection to the processor's database.
        tables: The processor's table names.
        limit: Maximum number of sagas returned.
    """
    rows = conn.execute(tables.render(_LIST), (limit,)).fetchall()
    return [ParkedSaga(t, i, reason, int(n), int(v), at) for t, i, reason, n, v, at in rows]


def retry_parked(
    conn: Conn,
    tables: Tables,
    planner: Planner,
    saga_type: str,
    saga_id: str,
    *,
    registry: MessageRegistry = default_registry,
    max_record_bytes: int = sys.maxsize,
) -> RetryResult:
    """Replays a parked saga's held messages in arrival order, all or nothing.

    The instance is planned as active (or as not yet started, when its start handler was the
    one that failed), so its handlers run on the held messages exactly as the consumer would
    have run them. On success the held rows are deleted and the saga's state, history, commands
    and deadlines are written in the same transaction; the relay is woken by the usual notify.

    Args:
        conn: An idle connection (autocommit, or with no transaction open); the retry commits
            or rolls back its own transaction on it.
        tables: The processor's table names.
        planner: The planner the processor runs, built from the (fixed) saga classes.
        saga_type: The parked saga's type name.
        saga_id: The parked saga's id.
        registry: Message types, to decode the held records.
        max_record_bytes: Size limit applied when decoding; held records already passed the
            consumer's limit once, so the default does not check again.

    Returns:
        What happened; `result.failure` names the message that failed again, if one did.

    Raises:
        NotParked: The saga does not exist or is not parked.
        ConcurrentUpdate: The instance changed under the retry (it is safe to run it again).
    """
    key = (saga_type, saga_id)
    held: list[_Held] = []
    try:
        with conn.transaction():
            found = conn.execute(tables.render(_LOCK), key).fetchone()
            if found is None or found[1] != PARKED:
                status = "missing" if found is None else found[1]
                raise NotParked(f"saga {saga_type} {saga_id} is not parked ({status})")
            held = [_held(row) for row in conn.execute(tables.render(_HELD), key).fetchall()]
            store = BatchStore(conn, tables, group_id="")
            ctx = _Replay(store, tables, planner, registry, max_record_bytes)
            ws = ctx.plan(SagaRow(*key, found[0], ACTIVE, found[2]), held)
            if held:
                conn.execute(tables.render(_RELEASE), ([h.parked_id for h in held],))
            # No offsets: the held records' offsets were committed when they were parked.
            store.write(ws, [])
    except _Failed as failed:
        return RetryResult(saga_type, saga_id, len(held), PARKED, failure=failed.failure)
    written = [s for s in ws.sagas if (s.saga_type, s.saga_id) == key]
    outcomes = tuple(
        ReplayOutcome(
            h.message_id, h.message_type, h.outcome, h.version, h.topic, h.partition, h.offset
        )
        for h in ws.history
        if (h.saga_type, h.saga_id) == key
    )
    return RetryResult(
        saga_type,
        saga_id,
        len(held),
        written[0].status if written else "discarded",
        outcomes,
        len(ws.dead_letters),
    )


@dataclass(frozen=True, slots=True)
class _Replay:
    store: BatchStore
    tables: Tables
    planner: Planner
    registry: MessageRegistry
    max_record_bytes: int

    def plan(self, row: SagaRow, held: Sequence[_Held]) -> WriteSet:
        """Plans the held messages against the unparked row; raises _Failed if one fails."""
        key = (row.saga_type, row.saga_id)
        items: list[Item | Rejected] = []
        wants = Wants({key}, set(), set())
        for h in held:
            decoded = decode(h.record, self.registry, self.max_record_bytes)
            routed, more = self.planner.route([decoded])
            # An event may also feed sagas of other types: those saw it when it was first
            # consumed, so only this saga's share is replayed.
            mine = [
                x
                for x in routed
                if isinstance(x, Rejected) or (x.bound.saga_type, x.saga_id) == key
            ]
            if not mine:
                raise _Failed(_failure(h, "the message no longer routes to this saga"))
            items.extend(mine)
            wants.message_keys.update(k for k in more.message_keys if k[:2] == key)
            wants.deadline_ids.update(more.deadline_ids)
        loaded = self.store.load(wants)
        # The one override: the instance runs as if it had never been parked, or as if it had
        # not started yet when its start handler was the one that failed.
        if row.state is None:
            row = dataclasses.replace(row, status=None)
        loaded = dataclasses.replace(loaded, sagas={**loaded.sagas, key: row})
        ws = self.planner.plan(items, loaded, loaded.now)
        if ws.parked:
            # Planning stops applying at the first failure; the rest are merely held behind it.
            first = ws.parked[0]
            by_record = {id(h.record): h for h in held}
            raise _Failed(_failure(by_record[id(first.record)], first.reason))
        if not any((s.saga_type, s.saga_id) == key for s in ws.sagas):
            self._unpark_unchanged(ws, row)
        return ws

    def _unpark_unchanged(self, ws: WriteSet, row: SagaRow) -> None:
        """Nothing applied (e.g. every held message was a duplicate): lift the parking anyway."""
        if row.state is None:
            # The start handler never succeeded, so there is no saga; keep no stateless row
            # that would make later events look like they belong to a started saga.
            args = (row.saga_type, row.saga_id, row.version)
            self.store.conn.execute(self.tables.render(_DISCARD), args)
            return
        ws.sagas.append(
            SagaWrite(
                row.saga_type, row.saga_id, row.state, ACTIVE, row.version + 1, row.version, None
            )
        )


def _held(row: tuple[Any, ...]) -> _Held:
    parked_id, topic, partition, offset, key, value, headers = row
    pairs = headers.items() if isinstance(headers, Mapping) else json.loads(headers).items()
    return _Held(
        int(parked_id),
        Record(
            topic=topic,
            partition=int(partition),
            offset=int(offset),
            key=bytes(key) if key is not None else None,
            value=bytes(value),
            headers=tuple((str(k), str(v).encode()) for k, v in pairs),
        ),
    )


def _failure(h: _Held, reason: str) -> RetryFailure:
    r = h.record
    return RetryFailure(h.parked_id, r.header("message-id"), r.topic, r.partition, r.offset, reason)


def retry_parked_saga(
    settings: ProcessorSettings,
    saga_type: str,
    saga_id: str,
    saga_classes: Iterable[type[Any]] | None = None,
    *,
    dependencies: Mapping[type, object] | None = None,
    registry: MessageRegistry | None = None,
) -> RetryResult:
    """`retry_parked` with the planner and tables a processor with these settings would use.

    Args:
        settings: The processor's settings.
        saga_type: The parked saga's type name.
        saga_id: The parked saga's id.
        saga_classes: Saga classes; None loads `settings.sagas`, as the processor does.
        dependencies: Objects the sagas' handlers ask for, as given to the processor.
        registry: Message types; None uses the default registry.

    Raises:
        NotParked: The saga does not exist or is not parked.
        ConcurrentUpdate: The instance changed under the retry (it is safe to run it again).
    """
    from processor.runtime.processor import Processor

    proc = Processor(
        settings, saga_classes, dependencies=dependencies, registry=registry or default_registry
    )
    conn, _tables = ops_connection(settings)
    with conn:
        return retry_parked(
            conn,
            proc.tables,
            proc.planner,
            saga_type,
            saga_id,
            registry=proc.registry,
            max_record_bytes=settings.consumer.max_record_bytes,
        )


# -- command line ------------------------------------------------------------------------------


def _parked_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=100, help="at most this many sagas")


@command(
    "retry",
    "replay a parked saga's held messages after its cause was fixed",
    arguments=saga_key_arguments,
)
def retry_command(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Exit code 0 when the saga flows again, 1 when a message failed again (nothing changed)."""
    result = retry_parked_saga(settings, args.saga_type, args.saga_id)
    for o in result.outcomes:
        where = f"{o.topic}[{o.partition}]@{o.offset}"
        version = f" v{o.version}" if o.version is not None else ""
        print(f"{o.outcome:<14} {o.message_type} {o.message_id} {where}{version}")
    if result.failure is not None:
        f = result.failure
        print(
            f"retry failed at held message {f.parked_id} ({f.topic}[{f.partition}]@{f.offset}, "
            f"message-id {f.message_id}): {f.reason}; the saga stays parked, nothing changed",
            file=sys.stderr,
        )
        return 1
    print(
        f"saga {result.saga_type} {result.saga_id}: {result.held} held messages replayed, "
        f"now {result.status}"
    )
    return 0


@command(
    "parked",
    "list parked sagas with their reason and how many messages they hold",
    arguments=_parked_arguments,
)
def parked_command(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints parked sagas, longest parked first; exit code 0 even when there are none."""
    conn, tables = ops_connection(settings)
    with conn:
        rows = list_parked(conn, tables, limit=args.limit)
    if not rows:
        print("no parked sagas")
        return 0
    print(
        text_table(
            ("SAGA TYPE", "SAGA ID", "HELD", "PARKED SINCE", "REASON"),
            (
                (r.saga_type, r.saga_id, str(r.held), r.parked_at.isoformat(), r.reason or "-")
                for r in rows
            ),
        )
    )
    return 0
