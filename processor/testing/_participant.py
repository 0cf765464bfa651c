"""In-memory participant test fixture: command handlers over SQLite, replies, dead letters."""

from __future__ import annotations

import pprint
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Self

from processor._authoring.messages import Message, MessageRegistry, registry
from processor._authoring.participant.definition import participant_of
from processor._authoring.participant.kit import CommandKit
from processor._engine.decode import Event, Rejected, decode
from processor._engine.records import OutboxRow, Record
from processor._invocation import command_message_id
from processor._memory.participant_sqlite import SqliteParticipantStore
from processor._ports.participant import Sql
from processor._wire import (
    HEADER_DEAD_LETTER_DETAIL,
    HEADER_DEAD_LETTER_REASON,
    HEADER_MESSAGE_ID,
    envelope,
)
from processor.settings import ConsumerSettings
from processor.testing._result import diff as _diff
from processor.testing._saga import DEFAULT_START_TIME

__all__ = ["DeadLettered", "ParticipantFixture", "ParticipantResult", "SentReply"]

# The consumer's defaults, as a participant service and the saga's processor run with them: a
# command larger than the service takes is dead-lettered, a reply too large fails the test.
_CONSUMER_DEFAULTS = ConsumerSettings.model_fields
_DEAD_LETTER_TOPIC = str(_CONSUMER_DEFAULTS["dead_letter_topic"].default)
_MAX_RECORD_BYTES = int(_CONSUMER_DEFAULTS["max_record_bytes"].default)


@dataclass(frozen=True)
class SentReply:
    """One reply a participant queued, as the relay would publish it.

    Attributes:
        message: The reply, decoded from its record as the saga's processor decodes it.
        headers: Its headers: ``message-id``, ``correlation-id`` (the command's),
            ``causation-id`` (the command's message id), ``saga-type`` and ``saga-id`` (copied).
        topic: Its topic, prefix included.
        key: Its record key.
    """

    message: Message
    headers: Mapping[str, str]
    topic: str
    key: str | None

    @property
    def message_id(self) -> str:
        """The reply's message id; a redelivered command is answered under the same one."""
        return self.headers[HEADER_MESSAGE_ID]


@dataclass(frozen=True)
class DeadLettered:
    """A record the kit set aside on the dead-letter topic.

    Attributes:
        reason: ``dead-letter-reason``, e.g. ``handler-failed`` or ``refused-by-database``.
        detail: ``dead-letter-detail``: the exception's type, or the database's message.
        headers: All its headers (the command's, plus the dead-letter ones).
    """

    reason: str
    detail: str
    headers: Mapping[str, str]


@dataclass
class ParticipantResult:
    """What delivering one command record did, with chainable expectations.

    Attributes:
        outcome: The kit's outcome: ``handled``, ``expired``, ``dropped``, ``duplicate``,
            ``skipped`` or ``dead-lettered``.
        record: The record delivered; :meth:`redeliver` delivers it again.
        replies: Replies queued by this delivery, in order (a duplicate's are the stored ones).
        dead_letters: Records dead-lettered by this delivery.
        fixture: The fixture that delivered it.
    """

    outcome: str
    record: Record
    replies: list[SentReply]
    dead_letters: list[DeadLettered]
    fixture: ParticipantFixture = field(repr=False)

    @property
    def messages(self) -> list[Message]:
        """The replies' messages, in order."""
        return [r.message for r in self.replies]

    def _context(self) -> str:
        why = "".join(f"; {d.reason}: {d.detail}" for d in self.dead_letters)
        return f"(outcome: {self.outcome}{why})"

    def expect_reply(self, *expected: Message) -> Self:
        """Assert exactly these replies were queued, in this order."""
        if list(expected) != self.messages:
            raise AssertionError(
                f"replies differ {self._context()}:\n" + _diff(list(expected), self.messages)
            )
        return self

    def expect_no_reply(self) -> Self:
        """Assert no reply was queued."""
        if self.replies:
            raise AssertionError(
                f"expected no reply {self._context()}, got:\n{pprint.pformat(self.messages)}"
            )
        return self

    def expect_outcome(self, outcome: str) -> Self:
        """Assert the kit's outcome, e.g. ``"duplicate"`` or ``"dropped"``."""
        if self.outcome != outcome:
            raise AssertionError(f"expected outcome {outcome!r} {self._context()}")
        return self

    def expect_dead_lettered(self, *, reason_contains: str | None = None) -> Self:
        """Assert the command was dead-lettered, and why when ``reason_contains`` is given.

        Args:
            reason_contains: Text expected in the dead letter's reason or detail, e.g.
                ``"handler-failed"``, an exception's type or a constraint's name.
        """
        if not self.dead_letters:
            raise AssertionError(
                f"expected the command to be dead-lettered {self._context()}; replies: "
                f"{pprint.pformat(self.messages)}"
            )
        if reason_contains is not None and not any(
            reason_contains in f"{d.reason}: {d.detail}" for d in self.dead_letters
        ):
            raise AssertionError(f"no dead letter mentions {reason_contains!r} {self._context()}")
        return self

    def redeliver(self) -> ParticipantResult:
        """Deliver the same record again, as the broker does after a crash or a rewind."""
        return self.fixture.deliver(self.record)


class ParticipantFixture:
    """Drives one participant through the real participant kit, in memory, with a virtual clock.

    Example:
        >>> fixture = ParticipantFixture(  # doctest: +SKIP
        ...     Inventory, schema="CREATE TABLE stock (sku text PRIMARY KEY, held int);"
        ... )
        >>> fixture.sql("INSERT INTO stock VALUES (%s, %s)", ("sku-1", 0))  # doctest: +SKIP
        >>> first = fixture.given_command(  # doctest: +SKIP
        ...     ReserveStock(order_id="o-1", sku="sku-1"), saga_type="order-saga", saga_id="o-1"
        ... ).expect_reply(StockReserved(order_id="o-1"))
        >>> again = first.redeliver().expect_reply(StockReserved(order_id="o-1"))  # doctest: +SKIP
        >>> assert [r.message_id for r in again.replies] == [  # doctest: +SKIP
        ...     r.message_id for r in first.replies
        ... ]
        >>> assert fixture.sql("SELECT held FROM stock") == [(1,)]  # doctest: +SKIP

    Each command becomes the record a saga sends (the processor's headers, keyed by the saga
    id) and is handled by :class:`~processor.participant.CommandKit`, the code the service runs:
    the inbox decides a redelivery (same replies, same message ids, handler not run), a command
    past its ``deadline-unix-ms`` gets the handler's declared expired reply (or none for
    ``DROP``), a handler that raises is rolled back and dead-lettered, ``SkipDelivery`` passes
    the record over unrecorded. ``Retryable`` and fatal failures propagate out of
    :meth:`given_command`, where the service would retry or stop.

    The handlers' :class:`~processor.participant.Sql` is an in-memory SQLite database holding
    ``schema``; the inbox row, the handler's statements and the replies commit together or not
    at all, as in PostgreSQL. It runs SQLite's dialect: ``%s`` and ``%(name)s`` placeholders,
    ``INSERT ... ON CONFLICT ... DO UPDATE`` and ``RETURNING`` work, PostgreSQL-only syntax
    (``::`` casts, ``DELETE ... USING``, ``FOR UPDATE``, ``jsonb``) does not, and numbers come
    back as ``int`` or ``float`` (see :class:`processor._memory.participant_sqlite.SqliteSql`).
    Run integration tests against the service's real PostgreSQL database.

    Args:
        participant: A class decorated with ``@participant`` (created without arguments) or
            an instance of one.
        settings: Values of ``Setting`` parameters.
        dependencies: Dependencies by type.
        schema: SQL script creating (and filling) the service's tables, in SQLite's dialect.
        start_time: Initial virtual time (timezone-aware).
        topic_prefix: Prefix of every topic, as the service is configured.
        message_registry: Where the commands and replies are registered.

    Attributes:
        participant: The participant instance the handlers run on.
        now: The virtual clock; deadlines are judged against it.
        kit: The kit under test (its ``counters`` count every outcome).
        store: The kit's tables (``store.memory.tables``) and the SQLite database
            (``store.connection``).
    """

    def __init__(
        self,
        participant: object,
        *,
        settings: Mapping[str, Any] | None = None,
        dependencies: Mapping[type, object] | None = None,
        schema: str = "",
        start_time: datetime = DEFAULT_START_TIME,
        topic_prefix: str = "",
        message_registry: MessageRegistry = registry,
    ) -> None:
        if start_time.tzinfo is None:
            raise ValueError("start_time must be timezone-aware")
        cls = participant if isinstance(participant, type) else type(participant)
        self.definition = participant_of(cls)
        self.participant = cls() if isinstance(participant, type) else participant
        self.now = start_time
        self.store = SqliteParticipantStore(schema)
        self._registry = message_registry
        self._prefix = topic_prefix
        try:
            self.kit = CommandKit(
                [self.participant],
                self.store,
                group_id=self.definition.name,
                dead_letter_topic=topic_prefix + _DEAD_LETTER_TOPIC,
                topic_prefix=topic_prefix,
                settings=settings,
                dependencies=dependencies,
                message_registry=message_registry,
                max_record_bytes=_MAX_RECORD_BYTES,
                clock=self._clock,
            )
        except BaseException:
            self.store.close()
            raise
        self._seq = 0
        self._offsets: dict[str, int] = {}

    def _clock(self) -> float:
        return self.now.timestamp()

    def given_command(
        self,
        command: Message,
        *,
        saga_type: str = "test-saga",
        saga_id: str = "saga-1",
        message_id: str | None = None,
        deadline: timedelta | datetime | None = None,
        headers: Mapping[str, str] | None = None,
        topic: str | None = None,
    ) -> ParticipantResult:
        """Deliver ``command`` as a saga sends it, at the current virtual time.

        Args:
            command: A command the participant handles.
            saga_type: The sending saga's type (``saga-type``).
            saga_id: The sending saga's id (``saga-id``, the record key, the correlation id).
            message_id: The command's id; by default one derived from saga and sequence, as
                the processor derives it. Delivering an id seen before is a redelivery.
            deadline: The budget (``deadline-unix-ms``): a delay from now, or an instant.
            headers: Further headers (e.g. ``traceparent``); they replace the standard ones
                of the same name, e.g. to deliver a malformed one.
            topic: Topic without prefix; the one registered for the command by default.

        Raises:
            AssertionError: The participant has no handler for the command.
            ValueError: No topic is known for the command, or the deadline is naive.
            RuntimeFailure: ``Retryable`` or fatal, raised by the kit where the service would
                retry the command later or stop.
        """
        if type(command) not in self.kit.command_types:
            handled = sorted(t.__qualname__ for t in self.kit.command_types)
            raise AssertionError(
                f"{self.definition.cls.__qualname__} has no handler for "
                f"{type(command).__qualname__}; it handles {handled}"
            )
        entry = self._registry.of(type(command))
        target = topic or entry.topic
        if target is None:
            raise ValueError(f"no topic for {type(command).__qualname__}: pass topic=...")
        self._seq += 1
        due = self.now + deadline if isinstance(deadline, timedelta) else deadline
        if due is not None and due.tzinfo is None:
            raise ValueError("deadline must be timezone-aware")
        wire = envelope(
            message_id=message_id or command_message_id(saga_type, saga_id, self._seq),
            message_type=entry.name,
            schema_version=entry.version,
            correlation_id=saga_id,
            causation_id=f"fixture-{self._seq}",
            occurred_at=self.now,
            saga_type=saga_type,
            saga_id=saga_id,
            deadline_unix_ms=int(due.timestamp() * 1000) if due is not None else None,
        )
        wire.update(headers or {})
        name = self._prefix + target
        offset = self._offsets.get(name, 0)
        self._offsets[name] = offset + 1
        record = Record(
            topic=name,
            partition=0,
            offset=offset,
            key=saga_id.encode(),
            value=command.model_dump_json().encode(),
            headers=tuple((k, v.encode()) for k, v in wire.items()),
            timestamp_ms=int(self.now.timestamp() * 1000),
        )
        return self.deliver(record)

    def deliver(self, record: Record) -> ParticipantResult:
        """Deliver ``record`` as it is, e.g. one built again or made malformed on purpose."""
        before = len(self.store.memory.tables.outbox)
        outcome = self.kit.handle(record)
        replies: list[SentReply] = []
        dead: list[DeadLettered] = []
        for row in self.store.memory.tables.outbox[before:]:
            if HEADER_DEAD_LETTER_REASON in row.headers:
                reason = row.headers[HEADER_DEAD_LETTER_REASON]
                dead.append(
                    DeadLettered(
                        reason, row.headers.get(HEADER_DEAD_LETTER_DETAIL, ""), row.headers
                    )
                )
            else:
                replies.append(self._reply(row))
        return ParticipantResult(outcome, record, replies, dead, self)

    def _reply(self, row: OutboxRow) -> SentReply:
        # Read back the way the saga's processor reads it: a reply it would dead-letter fails
        # the test here.
        decoded = decode(
            Record(
                row.topic,
                0,
                0,
                row.key,
                row.value,
                tuple((k, v.encode()) for k, v in row.headers.items()),
            ),
            self._registry,
            _MAX_RECORD_BYTES,
        )
        if not isinstance(decoded, Event):
            detail = (
                f"{decoded.reason}: {decoded.detail}" if isinstance(decoded, Rejected) else decoded
            )
            raise AssertionError(f"the saga's processor would not accept a reply: {detail}")
        return SentReply(
            decoded.message,
            dict(row.headers),
            row.topic,
            row.key.decode() if row.key is not None else None,
        )

    def when_time_elapses(self, delta: timedelta) -> Self:
        """Advance the virtual clock by ``delta``; later commands are judged against it."""
        if delta < timedelta(0):
            raise ValueError("time only moves forward")
        self.now += delta
        return self

    @contextmanager
    def transaction(self) -> Iterator[Sql]:
        """The service's database in one transaction, e.g. for a function that takes a ``Sql``.

        It commits when the block ends normally.
        """
        with self.store.transaction() as tx:
            yield tx.sql

    def sql(
        self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        """Run one statement on the service's tables in its own transaction; returns its rows.

        For setting tables up and for assertions: ``fixture.sql("SELECT held FROM stock")``.
        """
        with self.transaction() as sql:
            return sql.execute(query, params).fetchall()

    def close(self) -> None:
        """Close the SQLite database."""
        self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
