"""Replaying the messages held behind a parked saga, and resuming sagas parked on a newer version.

A saga is parked when a handler keeps raising; every later message for it is held in
`parked_message` so that nothing overtakes the failed one. A replay plans the held messages in
the order they arrived by the planner's one recipe (the consumer's), in one transaction guarded
by the instance's version: either every message applies and the saga flows again, or nothing
changes and the saga stays parked with the reason of the message that failed.

Two callers: the operator's retry (``processor.ops._parked``, which adds who asked and why) and
the processor itself (:func:`resume_too_new`), which retries the sagas parked on something
newer than the code that parked them knew. Both work over the resume store port only.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict, Unpack

from processor._authoring.choices import known_keywords
from processor._authoring.messages import MessageRegistry
from processor._engine.decode import FiredDeadline, Rejected, decode
from processor._engine.plan import TOO_NEW, Planner
from processor._engine.rows import ACTIVE, PARKED, HeldMessage, SagaRow, SagaWrite, Wants, WriteSet
from processor._errors import ConcurrentUpdate, Refused
from processor._ports.operator import ParkedStore, ResumeStore
from processor._wire import HEADER_MESSAGE_ID

__all__ = [
    "NotParked",
    "ReplayOptions",
    "ReplayOutcome",
    "RetryFailure",
    "RetryResult",
    "replay_parked",
    "resumable",
    "resume_too_new",
]


class NotParked(Refused):
    """The saga instance does not exist or is not parked, so there is nothing to retry."""


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


Annotate = Callable[[WriteSet, Sequence[HeldMessage]], None]
"""Adds rows of its own to a replay's writes (who asked, what was skipped), before they go."""


class _Failed(Exception):
    """Carries the failure out of the transaction so that leaving it rolls everything back."""

    def __init__(self, failure: RetryFailure) -> None:
        super().__init__(failure.reason)
        self.failure = failure


class _Replaying(TypedDict):
    # Required as a class of its own: Python reads ``Required[...]`` in no postponed annotation.
    registry: MessageRegistry


class ReplayOptions(_Replaying, total=False):
    """How a parked saga's held messages are replayed; ``registry`` is required.

    Attributes:
        registry: Message types, to decode the held records; the planner's own.
        max_record_bytes: Size limit applied when decoding; held records already passed the
            consumer's limit once, so the default (none) does not check again.
        skip: How many of the first held messages to drop instead of replaying (none by
            default).
    """

    max_record_bytes: int
    skip: int


def replay_parked(
    store: ParkedStore,
    planner: Planner,
    saga_type: str,
    saga_id: str,
    *,
    annotate: Annotate | None = None,
    **options: Unpack[ReplayOptions],
) -> RetryResult:
    """Replays a parked saga's held messages in arrival order, all or nothing.

    The instance is planned as active (or as not yet started, when its start handler was the
    one that failed), so its handlers run on the held messages exactly as the consumer would
    have run them. On success the held rows are deleted and the saga's state, history, commands
    and deadlines are written in the same transaction; the relay is woken by the usual notify.

    Args:
        store: The processor's database, on an idle connection; the replay commits or rolls
            back its own transaction on it.
        planner: The planner the processor runs, built from the (fixed) saga classes.
        saga_type: The parked saga's type name.
        saga_id: The parked saga's id.
        annotate: Adds rows to the writes, inside the transaction (the operator's record).
        **options: ``registry``, ``max_record_bytes``, ``skip``: see :class:`ReplayOptions`.

    Returns:
        What happened; `result.failure` names the message that failed again, if one did.

    Raises:
        NotParked: The saga does not exist or is not parked.
        ConcurrentUpdate: The instance changed under the replay (it is safe to run it again).
    """
    known_keywords(options, ReplayOptions)
    skip = options.get("skip", 0)
    key = (saga_type, saga_id)
    held: list[HeldMessage] = []
    try:
        with store.transaction():
            found = store.lock_saga(saga_type, saga_id)
            if found is None or found.status != PARKED:
                status = "missing" if found is None else found.status
                raise NotParked(f"saga {saga_type} {saga_id} is not parked ({status})")
            held = store.held_messages(saga_type, saga_id)
            ctx = _Replay(
                store, planner, options["registry"], options.get("max_record_bytes", sys.maxsize)
            )
            ws = ctx.plan(dataclasses.replace(found, status=ACTIVE), held[skip:])
            ws.deadline_deletes[:0] = ctx.skipped_deadlines(key, held[:skip])
            if annotate is not None:
                annotate(ws, held)
            if held:
                store.release_held([h.parked_id for h in held])
            # The poller skipped this saga's deadlines while it was parked: wake it, so the
            # ones that came due meanwhile fire now rather than at its next polling interval.
            ws.wake_deadlines = True
            # No offsets: the held records' offsets were committed when they were parked.
            store.write(ws)
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
    store: ParkedStore
    planner: Planner
    registry: MessageRegistry
    max_record_bytes: int

    def plan(self, row: SagaRow, held: Sequence[HeldMessage]) -> WriteSet:
        """Plans the held messages against the unparked row; raises _Failed if one fails."""
        key = (row.saga_type, row.saga_id)
        decoded = [decode(h.record, self.registry, self.max_record_bytes) for h in held]
        prepared = self.planner.prepare(decoded, only=key)
        routed = {
            id(x.record if isinstance(x, Rejected) else x.decoded.record) for x in prepared.items
        }
        for h in held:
            if id(h.record) not in routed:
                raise _Failed(_failure(h, "the message no longer routes to this saga"))
        loaded = self.store.load(prepared.wants)
        # The one override: the instance runs as if it had never been parked, or as if it had
        # not started yet when its start handler was the one that failed.
        if row.state is None:
            row = dataclasses.replace(row, status=None)
        loaded = dataclasses.replace(loaded, sagas={**loaded.sagas, key: row})
        # Replayed: a held fired deadline applies if its row still matches and is due, whatever
        # token it was fired under (the lease may have moved on while the saga was parked).
        ws = self.planner.apply(prepared, loaded, replay=True)
        if ws.parked:
            # Planning stops applying at the first failure; the rest are merely held behind it.
            first = ws.parked[0]
            by_record = {id(h.record): h for h in held}
            raise _Failed(_failure(by_record[id(first.record)], first.reason))
        if not any((s.saga_type, s.saga_id) == key for s in ws.sagas):
            self._unpark_unchanged(ws, row)
        return ws

    def skipped_deadlines(
        self, key: tuple[str, str], skipped: Sequence[HeldMessage]
    ) -> list[tuple[str, str, str]]:
        """The deadline rows that skipped fired records fired: consumed, so deleted.

        Left in place, such a row stays marked dispatched and fires again only when the lease
        moves to another token, or never. A row of the same name with another id (scheduled
        after the one that fired) stays.
        """
        fired = [
            d
            for d in (decode(h.record, self.registry, self.max_record_bytes) for h in skipped)
            if isinstance(d, FiredDeadline)
        ]
        if not fired:
            return []
        rows = self.store.load(Wants({key}, set(), {f.deadline_id for f in fired})).deadlines
        out: list[tuple[str, str, str]] = []
        for f in fired:
            row = rows.get(f.deadline_id)
            if row is not None and (row.saga_type, row.saga_id, row.name) == (*key, f.name):
                out.append((*key, f.name))
        return out

    def _unpark_unchanged(self, ws: WriteSet, row: SagaRow) -> None:
        """Nothing applied (e.g. every held message was a duplicate): lift the parking anyway."""
        if row.state is None:
            # The start handler never succeeded, so there is no saga; keep no stateless row
            # that would make later events look like they belong to a started saga.
            self.store.discard_saga(row.saga_type, row.saga_id, row.version)
            return
        ws.sagas.append(
            SagaWrite(
                row.saga_type,
                row.saga_id,
                row.state,
                ACTIVE,
                row.version + 1,
                row.version,
                None,
                state_version=row.state_version,
            )
        )


def _failure(h: HeldMessage, reason: str) -> RetryFailure:
    r = h.record
    return RetryFailure(
        h.parked_id, r.header(HEADER_MESSAGE_ID), r.topic, r.partition, r.offset, reason
    )


def resume_too_new(
    store: ResumeStore,
    planner: Planner,
    *,
    registry: MessageRegistry,
    limit: int = 10_000,
    state_versions: Mapping[str, int] | None = None,
) -> list[RetryResult]:
    """Retries the sagas parked only because something was newer than the code then knew.

    Two causes, both met in rollouts: an event at a schema version the code did not know yet
    (producers deployed before processors), and a saga's stored state at a state version the
    code did not know (a rolling deploy: an old pod read a row a new pod wrote). A processor
    runs this when it starts and then every ``SAGA_CONSUMER__RESUME_INTERVAL``, so both heal by
    themselves once code that knows the version runs. A saga parked on a state version this
    code does not know either is left alone; one whose held event is still too new stays parked
    as it was (the retry changes nothing). Another replica's retry of the same saga, or a batch
    that moved it meanwhile, is skipped.

    Args:
        store: The processor's database (lists parked sagas, retries them).
        planner: The planner this code runs.
        registry: Message types, to decode the held records.
        limit: Most parked sagas looked at.
        state_versions: The state version this code writes, by saga type; None retries every
            saga parked on a stored state too new for the code that parked it.
    """
    results = []
    for parked in store.parked_sagas(limit):
        if not resumable(parked.reason, parked.saga_type, state_versions):
            continue
        try:
            results.append(
                replay_parked(store, planner, parked.saga_type, parked.saga_id, registry=registry)
            )
        except (NotParked, ConcurrentUpdate):
            continue
    return results


_STATE_TOO_NEW = re.compile(r"stored state is v(\d+), newer than this code's v\d+")


def resumable(reason: str | None, saga_type: str, state_versions: Mapping[str, int] | None) -> bool:
    """Whether a saga parked for ``reason`` may go on under code at ``state_versions``."""
    if reason is None:
        return False
    if TOO_NEW in reason:
        return True
    found = _STATE_TOO_NEW.search(reason)
    if found is None:
        return False
    if state_versions is None:
        return True
    return state_versions.get(saga_type, 0) >= int(found.group(1))
