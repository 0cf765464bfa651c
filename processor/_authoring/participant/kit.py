"""Runs commands in transactions: inbox row, the handler's SQL, replies and position together.

A consumer batch of commands goes in one transaction when every record in it is a command to
run (the common case): one commit, one statement of replies and one relay round for the batch
rather than for each command. A record that is not (a dead letter, a skipped delivery) or a
handler that raises sends the batch back, rolled back, to one transaction per command, which
decides each record as it always did; a handler may then run a second time for the same command,
as it does when a lost connection rolls its transaction back. For each command:

- the inbox row is inserted first, keyed by the command's message id, so the primary key
  decides whether the command is new; a command seen before is not run again, and the replies
  stored with its inbox row are queued again under the same message ids;
- a command whose ``deadline-unix-ms`` has passed is not run; its handler's declared expired
  reply is queued instead (or nothing, when declared ``DROP``);
- otherwise the handler runs with the service's connection, and its replies are queued in the
  participant's outbox, which the processor's relay publishes;
- the partition's position moves past the command.

A registered command type that no handler here takes belongs to another participant reading
the same topic (each in its own consumer group): it is passed over. A record that can never be
a command (undecodable, unregistered type, refused by the database, or a handler that raised)
is dead-lettered with the processor's dead-letter headers, and its message id (when it has
one) is recorded, so a redelivery is not dead-lettered twice.

The kit speaks only to :class:`processor._ports.participant.ParticipantStore`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from processor._authoring.binding import ResolvedParam, resolve_handler
from processor._authoring.messages import MessageRegistry, registry
from processor._authoring.participant.definition import DROP, CommandHandlerDef, participant_of
from processor._authoring.participant.handles import Bucket, Replies, SkipDelivery, reply_row
from processor._engine.decode import Event, Reason, Rejected, decode
from processor._engine.records import OutboxRow, Record
from processor._errors import ConfigurationError, Failure, RuntimeFailure
from processor._ports.participant import Claim, InboxEntry, ParticipantStore, ParticipantTx
from processor._schemas.codec import Wire
from processor._wire import HEADER_DEADLINE_UNIX_MS, dead_letter_headers

__all__ = ["HANDLER_FAILED", "CommandKit", "Counters"]

log = logging.getLogger(__name__)

HANDLER_FAILED = "handler-failed"
"""Dead-letter reason of a command whose handler raised."""


@dataclass
class Counters:
    """What the kit did since start."""

    handled: int = 0
    duplicates: int = 0
    expired: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    not_handled: int = 0
    replies: int = 0


@dataclass(frozen=True)
class _Bound:
    instance: object
    handler: CommandHandlerDef
    params: tuple[ResolvedParam, ...]


class CommandKit:
    """Handles commands for one or more participants.

    Args:
        participants: Participant classes (created without arguments) or instances.
        store: The participant's tables.
        group_id: Consumer group whose positions are stored.
        dead_letter_topic: Full topic name (prefix included) for dead letters.
        topic_prefix: Prefix of every reply topic.
        settings: Values of ``Setting`` parameters.
        dependencies: Values of dependency parameters, by type.
        message_registry: Where command and reply types are registered.
        max_record_bytes: Larger commands are dead-lettered as oversized.
        clock: Seconds since the epoch, for deadlines.
        on_queued: Called after a commit that queued outbox rows (wakes the relay).
        wire: Translates commands of registry-framed topics (their schemas fetched first).

    Raises:
        ConfigurationError: A handler's settings or dependencies cannot be resolved, or two
            participants handle the same command type.
    """

    def __init__(
        self,
        participants: Sequence[object],
        store: ParticipantStore,
        *,
        group_id: str,
        dead_letter_topic: str,
        topic_prefix: str = "",
        settings: Mapping[str, Any] | None = None,
        dependencies: Mapping[type, object] | None = None,
        message_registry: MessageRegistry = registry,
        max_record_bytes: int = 1_048_576,
        clock: Callable[[], float] = time.time,
        on_queued: Callable[[], None] | None = None,
        wire: Wire | None = None,
    ) -> None:
        self._store = store
        self._wire = wire
        self.group_id = group_id
        self._dead_letter_topic = dead_letter_topic
        self._prefix = topic_prefix
        self._registry = message_registry
        self._max_bytes = max_record_bytes
        self._clock = clock
        self._on_queued = on_queued or (lambda: None)
        self.counters = Counters()
        self._bound = _bind(participants, settings or {}, dependencies or {})

    @property
    def command_types(self) -> list[type]:
        """Every command type handled."""
        return list(self._bound)

    def handle_together(self, records: Sequence[Record]) -> bool:
        """Handles ``records`` in one transaction when each is a command to run or pass over.

        Returns:
            True when the batch committed. False when it was rolled back for one transaction
            per record (:meth:`handle`, in order): a record to dead-letter or to skip, or a
            handler that raised; the counters are then as before the call.

        Raises:
            RuntimeFailure: ``Retryable`` or fatal; the batch's transaction rolled back.
        """
        if len(records) < 2:
            return False
        before = replace(self.counters)
        try:
            with self._store.transaction() as tx:
                work: list[tuple[Record, Event, _Bound | None]] = []
                claims: dict[str, Claim] = {}
                for record in records:
                    decoded = decode(record, self._registry, self._max_bytes, self._wire)
                    if not isinstance(decoded, Event) or _bad_deadline(decoded):
                        raise _Apart
                    bound = self._bound.get(type(decoded.message))
                    work.append((record, decoded, bound))
                    meta = decoded.metadata
                    if bound is not None and meta.message_id not in claims:
                        claims[meta.message_id] = Claim(
                            meta.message_id,
                            meta.message_type,
                            record.topic,
                            record.partition,
                            record.offset,
                            record.key,
                        )
                seen = tx.claim_all(list(claims.values()))
                # A command repeated within the batch is a duplicate of its first delivery.
                done: dict[str, InboxEntry] = {}
                for record, decoded, bound in work:
                    if bound is None:
                        self._advance(tx, record)
                        self.counters.not_handled += 1
                        continue
                    mid = decoded.metadata.message_id
                    entry = done.get(mid) or seen[mid]
                    done[mid] = self._run(tx, bound, decoded, entry)
        except Exception as e:
            self.counters.__dict__.update(before.__dict__)
            if isinstance(e, RuntimeFailure) and e.kind is not Failure.RECORD_DATA:
                raise
            if not isinstance(e, _Apart):
                log.info(
                    "command batch of %d records goes one command at a time: %s",
                    len(records),
                    type(e).__name__,
                )
            return False
        if self.counters.replies > before.replies:
            self._on_queued()
        return True

    def handle(self, record: Record) -> str:
        """Handles one record in its own transaction; returns its outcome.

        Returns:
            ``handled``, ``expired``, ``dropped``, ``duplicate``, ``skipped``, ``not-handled``
            or ``dead-lettered``.

        Raises:
            RuntimeFailure: ``Retryable`` (try the record again later) or a fatal failure; the
                record's transaction rolled back.
        """
        decoded = decode(record, self._registry, self._max_bytes, self._wire)
        if isinstance(decoded, Rejected):
            return self._dead_letter(record, None, decoded.reason, decoded.detail)
        if not isinstance(decoded, Event):
            return self._dead_letter(
                record, None, Reason.UNKNOWN_TYPE, "a deadline record on a command topic"
            )
        if _bad_deadline(decoded):
            return self._dead_letter(
                record, None, Reason.INVALID_HEADER, f"{HEADER_DEADLINE_UNIX_MS} is not an integer"
            )
        bound = self._bound.get(type(decoded.message))
        if bound is None:
            # A registered command of another participant on a shared topic: not ours to judge.
            with self._store.transaction() as tx:
                self._advance(tx, record)
            self.counters.not_handled += 1
            return "not-handled"
        try:
            with self._store.transaction() as tx:
                record, meta = decoded.record, decoded.metadata
                claimed = tx.claim(
                    meta.message_id,
                    meta.message_type,
                    record.topic,
                    record.partition,
                    record.offset,
                    record.key,
                )
                outcome = self._run(tx, bound, decoded, claimed).outcome
        except SkipDelivery:
            with self._store.transaction() as tx:
                self._advance(tx, record)
            self.counters.skipped += 1
            return "skipped"
        except RuntimeFailure as e:
            if e.kind is not Failure.RECORD_DATA:
                raise
            return self._dead_letter(
                record, decoded, Reason.REFUSED_BY_DATABASE, str(e) or type(e).__name__
            )
        except Exception as e:
            # The handler's bug, not the infrastructure: its work rolled back; set it aside.
            log.warning(
                "handler %s failed for command %s: %s",
                bound.handler.name,
                decoded.metadata.message_id,
                type(e).__name__,
                exc_info=True,
            )
            return self._dead_letter(record, decoded, HANDLER_FAILED, type(e).__name__)
        self._on_queued()
        return outcome

    def _run(
        self, tx: ParticipantTx, bound: _Bound, event: Event, seen: InboxEntry | None
    ) -> InboxEntry:
        """Runs a claimed command (``seen``: its earlier entry, when it was seen before).

        Returns:
            What its inbox row holds now; ``outcome`` is ``duplicate`` for one seen before.
        """
        record, meta = event.record, event.metadata
        if seen is not None:
            tx.publish(seen.replies)
            self._advance(tx, record)
            self.counters.duplicates += 1
            self.counters.replies += len(seen.replies)
            return InboxEntry(seen.message_id, "duplicate", seen.replies)
        deadline = meta.headers.get(HEADER_DEADLINE_UNIX_MS)
        if deadline is not None and int(deadline) < self._clock() * 1000:
            replies: list[OutboxRow] = []
            if bound.handler.expired != DROP:
                build = bound.handler.expired
                assert callable(build)
                reply = build(event.message)
                replies.append(
                    reply_row(
                        reply,
                        meta.headers,
                        record.key,
                        registry=self._registry,
                        topic=self._prefix + (self._registry.of(type(reply)).topic or ""),
                    )
                )
            outcome = "expired" if replies else "dropped"
            tx.finish(meta.message_id, outcome, replies)
            self._advance(tx, record)
            self.counters.expired += 1
            self.counters.replies += len(replies)
            return InboxEntry(meta.message_id, outcome, tuple(replies))
        handle = Replies(
            meta.headers, record.key, registry=self._registry, topic_prefix=self._prefix
        )
        kwargs: dict[str, Any] = {}
        for name, kind in bound.handler.kit_params.items():
            if kind == "replies":
                kwargs[name] = handle
            elif kind == "bucket":
                kwargs[name] = Bucket(tx.bucket_of(meta.message_id))
            else:
                kwargs[name] = tx.sql
        for rp in bound.params:
            p = rp.param
            if rp.constant:
                kwargs[p.name] = rp.value
            elif p.kind == "event":
                kwargs[p.name] = event.message
            elif p.kind == "metadata":
                kwargs[p.name] = meta
        bound.handler.func(bound.instance, **kwargs)
        tx.finish(meta.message_id, "handled", handle.rows)
        self._advance(tx, record)
        self.counters.handled += 1
        self.counters.replies += len(handle.rows)
        return InboxEntry(meta.message_id, "handled", tuple(handle.rows))

    def _advance(self, tx: ParticipantTx, record: Record) -> None:
        tx.advance(self.group_id, record.topic, record.partition, record.offset + 1)

    def _dead_letter(self, record: Record, event: Event | None, reason: str, detail: str) -> str:
        headers = dead_letter_headers(
            record.headers_text(),
            reason=str(reason),
            detail=detail[:2000],
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
        )
        row = OutboxRow(
            None, None, self._dead_letter_topic, record.key, headers, record.value or b""
        )
        with self._store.transaction() as tx:
            seen = None
            if event is not None:
                meta = event.metadata
                seen = tx.claim(
                    meta.message_id,
                    meta.message_type,
                    record.topic,
                    record.partition,
                    record.offset,
                    record.key,
                )
                if seen is None:
                    tx.finish(meta.message_id, "dead-lettered", [])
            if seen is None:
                tx.publish([row])
                self.counters.dead_lettered += 1
            self._advance(tx, record)
        self._on_queued()
        log.warning(
            "command at %s/%d@%d dead-lettered: %s",
            record.topic,
            record.partition,
            record.offset,
            reason,
        )
        return "dead-lettered"


class _Apart(Exception):
    """A record of the batch is decided on its own (dead-lettered, or not a command)."""


def _bad_deadline(event: Event) -> bool:
    deadline = event.metadata.headers.get(HEADER_DEADLINE_UNIX_MS)
    return deadline is not None and not deadline.strip().lstrip("-").isdigit()


def bind_participants(
    participants: Sequence[object], settings: Mapping[str, Any], dependencies: Mapping[type, object]
) -> None:
    """Checks that every command handler's parameters are provided, running nothing.

    Raises:
        ConfigurationError: Every parameter nothing provides, and command types handled twice.
    """
    _bind(participants, settings, dependencies)


def _bind(
    participants: Sequence[object], settings: Mapping[str, Any], dependencies: Mapping[type, object]
) -> dict[type, _Bound]:
    problems: list[str] = []
    bound: dict[type, _Bound] = {}
    for item in participants:
        cls = item if isinstance(item, type) else type(item)
        definition = participant_of(cls)
        instance = cls() if isinstance(item, type) else item
        for command_type, handler in definition.handlers.items():
            if command_type in bound:
                problems.append(
                    f"command {command_type.__qualname__} is handled by two participants; "
                    "run them in separate services or merge the handlers"
                )
                continue
            params = resolve_handler(
                handler.as_handler(), settings, dependencies, problems, app="ParticipantApp"
            )
            bound[command_type] = _Bound(instance, handler, params)
    if problems:
        raise ConfigurationError(problems)
    return bound
