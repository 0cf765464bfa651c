"""A participant service's loops: consumes command topics in batches, runs the kit, relays replies.

Ports only: the participant store, the consumer, the outbox relay and its wake-up source are
given (``processor._bootstrap.participant`` builds them over PostgreSQL and Kafka). The loops are
supervised like the processor's.

It outlives restarts of the database and of the broker: a command that meets a lost connection
is rolled back, its partition is rewound to it, and the loop backs off and goes on; the
connection is opened again on the next command. A fatal failure stops every loop (exit and let
the platform restart the process); nothing is lost, because positions, inbox and outbox commit
together.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from processor._authoring.messages import MessageRegistry, registry
from processor._authoring.participant.kit import CommandKit
from processor._authoring.participant.rewind import RewindGuard
from processor._engine.records import Record
from processor._errors import Failure, LoopDied, RuntimeFailure, Unreachable, classify
from processor._ports.consumer import RecordConsumer, WakeSource
from processor._ports.participant import ParticipantStore
from processor._runtime.hooks import HookPoint, Hooks
from processor._runtime.relay import Relay
from processor._runtime.schemas import SchemaResolver
from processor._runtime.stopping import CONSUMER_CLOSE, close_within
from processor._runtime.supervisor import Supervisor
from processor._wire import HEADER_MESSAGE_ID, HEADER_SAGA_ID, HEADER_SAGA_TYPE, Topics
from processor.settings import ConsumerSettings

__all__ = ["SHUTDOWN_TIMEOUT", "ConsumerFactory", "ParticipantRuntime"]

log = logging.getLogger(__name__)

TP = tuple[str, int]

SHUTDOWN_TIMEOUT = timedelta(seconds=20)
"""How long a stop may take by default (the processor's ``SAGA_SHUTDOWN_TIMEOUT`` default)."""

ConsumerFactory = Callable[
    [str, Sequence[str], Callable[[list[TP]], Mapping[TP, int | None]], Callable[[list[TP]], None]],
    RecordConsumer,
]
"""Makes the group member: (group id, topics, on assign, on revoke) to a consumer."""


class ParticipantRuntime:
    """Runs participants over a participant store, a consumer and an outbox relay.

    Args:
        participants: Participant classes (created without arguments) or instances.
        store: The service's inbox, outbox and positions.
        relay: Publishes the outbox; woken by each command that queued a reply.
        wake_source: Notifications of the outbox's commits, which also wake the relay.
        consumer: Makes the group member, once per :meth:`run`.
        schema: Where the store keeps its tables (for the logs).
        group_id: Consumer group; defaults to ``consumer_settings.group_id``.
        topics: Command topics without prefix; defaults to the topics registered for the
            handled command types.
        topic_prefix: Prefix of every topic on the broker.
        consumer_settings: Batch size, timeouts and dead-letter topic.
        settings: Values of ``Setting`` parameters.
        dependencies: Dependencies of handlers, by type.
        message_registry: Where the messages are registered.
        shutdown_timeout: How long a stop may take, the consumer's close included (half of it
            at most); see :mod:`processor._runtime.stopping` for the process around it.
        hooks: Fault points for tests (see :class:`processor._runtime.hooks.Hooks`).
        wire: Translates commands of registry-framed topics; None: every topic is our JSON.
    """

    def __init__(
        self,
        participants: Sequence[object],
        *,
        store: ParticipantStore,
        relay: Relay,
        wake_source: WakeSource,
        consumer: ConsumerFactory,
        schema: str,
        group_id: str | None = None,
        topics: Sequence[str] | None = None,
        topic_prefix: str = "",
        consumer_settings: ConsumerSettings | None = None,
        settings: Mapping[str, Any] | None = None,
        dependencies: Mapping[type, object] | None = None,
        message_registry: MessageRegistry = registry,
        shutdown_timeout: timedelta = SHUTDOWN_TIMEOUT,
        hooks: Hooks | None = None,
        wire: SchemaResolver | None = None,
    ) -> None:
        self.schema = schema
        self._wire = wire
        self._cs = consumer_settings or ConsumerSettings()
        self._names = Topics(topic_prefix)
        self._make_consumer = consumer
        self._wake_source = wake_source
        self.group_id = group_id or self._cs.group_id
        self.stop_event = threading.Event()
        self.shutdown_timeout = shutdown_timeout.total_seconds()
        self.hooks = hooks if hooks is not None else Hooks()
        # What the last stop left running past its budget (see Processor.left_running).
        self.left_running: list[str] = []
        self.store = store
        self.relay = relay
        self.kit = CommandKit(
            participants,
            self.store,
            group_id=self.group_id,
            dead_letter_topic=self._names.name(self._cs.dead_letter_topic),
            topic_prefix=topic_prefix,
            settings=settings,
            dependencies=dependencies,
            message_registry=message_registry,
            max_record_bytes=self._cs.max_record_bytes,
            on_queued=self.relay.wake.set,
            wire=wire.wire if wire is not None else None,
        )
        if topics is None:
            found = {message_registry.of(t).topic for t in self.kit.command_types}
            topics = sorted(t for t in found if t is not None)
        self.topics = [self._names.name(t) for t in topics]
        self.failed_rounds = 0
        # For the probes: the running loops, when the consumer loop last stepped (monotonic),
        # and how many batches in a row have failed.
        self.supervisor: Supervisor | None = None
        self.last_step: float | None = None
        self.failing = 0
        self._guard = RewindGuard(lambda tp, offset: None)  # replaced by the consumer's
        # The group member of the running consumer loop (for health and reports).
        self.consumer: RecordConsumer | None = None

    def _positions(self, tps: list[TP]) -> Mapping[TP, int | None]:
        # Inside the consumer's rebalance callback: wait for the database rather than start
        # from the beginning of the partition (safe with the inbox, but slow).
        attempts = 0
        log.info("partitions assigned: %s", sorted(tps))
        self._guard.forget(tps)
        while True:
            try:
                return self.store.positions(self.group_id, tps)
            except RuntimeFailure as e:
                if e.kind is not Failure.RETRYABLE or self.stop_event.is_set():
                    raise
                attempts += 1
                log.warning("positions unavailable (%s); trying again", e)
                self.stop_event.wait(_backoff(attempts))

    def run(self, stop: threading.Event | None = None) -> None:
        """Consumes and handles commands until ``stop`` (or :attr:`stop_event`) is set.

        Raises:
            LoopDied: The relay loop or the consumer loop met a fatal failure.
        """
        stop = stop or self.stop_event
        supervisor = self.supervisor = Supervisor(stop)
        supervisor.spawn("participant-relay", self.relay.run)
        listener = self._wake_source
        supervisor.spawn(
            "participant-relay-listener", lambda s: listener.run(s, self.relay.wake.set)
        )
        supervisor.spawn("participant-consumer", self._consume)
        stop.wait()
        ends = time.monotonic() + self.shutdown_timeout
        stuck = supervisor.join(lambda: ends - time.monotonic())
        if stuck:
            log.warning("loops still running at the end of the shutdown budget: %s", stuck)
            self.left_running.extend(stuck)
        self.store.close()
        self.relay.close()
        failure = supervisor.failure
        if failure is not None:
            raise LoopDied(failure.describe())

    def _consume(self, stop: threading.Event) -> None:
        consumer = self.consumer = self._make_consumer(
            self.group_id, self.topics, self._positions, self._revoked
        )
        self._guard = RewindGuard(consumer.seek)
        failures = 0
        try:
            while not stop.is_set():
                self.last_step = time.monotonic()
                records = self._guard.admit(
                    consumer.consume(self._cs.batch_size, self._cs.batch_timeout.total_seconds())
                )
                stalled = self._handle(records)
                # The database holds the positions; Kafka's copy only serves lag tools.
                handled = {
                    (r.topic, r.partition): r.offset + 1
                    for r in records
                    if (r.topic, r.partition) not in stalled
                }
                if handled:
                    consumer.commit_advisory(handled)
                if not stalled:
                    failures = self.failing = 0
                    continue
                self._guard.rewind(stalled)
                # Partitions that went on keep going at the first step's pace; the wait grows
                # only while nothing does.
                failures = 1 if handled else failures + 1
                self.failing = failures
                self.failed_rounds += 1
                stop.wait(_backoff(failures))
        finally:
            # Leaving the group needs the broker: without it the close may never end.
            wait = self.shutdown_timeout / 2
            if not close_within(CONSUMER_CLOSE, consumer.close, wait):
                log.warning("consumer close did not finish in %.0f s; leaving it", wait)
                self.left_running.append(CONSUMER_CLOSE)

    def _revoked(self, tps: list[TP]) -> None:
        self.hooks.fire(HookPoint.REVOKE)
        self._guard.forget(tps)
        log.info("partitions revoked: %s", sorted(tps))

    def handle_batch(self, records: Sequence[Record]) -> bool:
        """Handles records in order; returns whether every one of them was handled.

        The batch goes in one transaction when it can (``CommandKit.handle_together``), else
        one transaction per record. A transient failure rewinds each partition it held back to
        its first record whose transaction did not commit (see :meth:`_handle`).
        """
        stalled = self._handle(records)
        if stalled:
            self._guard.rewind(stalled)
        return not stalled

    def _handle(self, records: Sequence[Record]) -> dict[TP, int]:
        """Handles ``records``; returns the partitions held back, each at its first record left.

        A transient failure the database answered (a Citus worker behind the coordinator
        failed, a lock wait timed out) holds back only the partition it met: the others go on,
        each in a transaction of its own. With the tables by bucket they live on other workers,
        which may answer. A database that does not answer (``Unreachable``) holds back all.
        """
        if self._wire is not None:
            try:
                # Raises Retryable while the registry is away: the batch is read again.
                self._wire.prepare_in(records)
            except Exception as e:
                if classify(e) is not Failure.RETRYABLE:
                    raise
                log.warning("command batch waits (%s); rewinding to retry", e)
                return _firsts(records)
        try:
            if self.kit.handle_together(records):
                return {}
        except Exception as e:
            if classify(e) is not Failure.RETRYABLE:
                raise
            groups = _by_partition(records)
            if isinstance(e, Unreachable) or len(groups) < 2:
                log.warning("command batch stopped (%s); rewinding to retry", e)
                return _firsts(records)
            log.warning("command batch stopped (%s); its partitions go on one by one", e)
            return self._partitions(groups)
        return self._one_by_one(records)

    def _partitions(self, groups: dict[TP, list[Record]]) -> dict[TP, int]:
        """Each partition's records in a transaction of their own (or one per record)."""
        stalled: dict[TP, int] = {}
        pending = list(groups.items())
        for i, (tp, group) in enumerate(pending):
            try:
                if self.kit.handle_together(group):
                    continue
            except Exception as e:
                if classify(e) is not Failure.RETRYABLE:
                    raise
                stalled[tp] = group[0].offset
                if isinstance(e, Unreachable):
                    stalled.update((t, g[0].offset) for t, g in pending[i + 1 :])
                    log.warning("the database does not answer (%s); rewinding to retry", e)
                    break
                _log_waits(group[0], e)
                continue
            stalled.update(self._one_by_one(group))
        return stalled

    def _one_by_one(self, records: Sequence[Record]) -> dict[TP, int]:
        """Each record in a transaction of its own, in order; as :meth:`_handle` on failure."""
        stalled: dict[TP, int] = {}
        for i, record in enumerate(records):
            tp = (record.topic, record.partition)
            if tp in stalled:
                continue
            try:
                self.kit.handle(record)
            except Exception as e:
                if classify(e) is not Failure.RETRYABLE:
                    raise
                stalled[tp] = record.offset
                if isinstance(e, Unreachable):
                    for rest in _firsts(records[i + 1 :]).items():
                        stalled.setdefault(*rest)
                    log.warning("the database does not answer (%s); rewinding to retry", e)
                    break
                _log_waits(record, e)
        return stalled

    def stop(self) -> None:
        """Asks :meth:`run` to return."""
        self.stop_event.set()

    def close(self) -> None:
        """Stops :meth:`run` and releases the connections (also those opened after it ended)."""
        self.stop()
        self.store.close()
        self.relay.close()


def _log_waits(record: Record, error: Exception) -> None:
    """Says that ``record``'s partition waits at it, naming its command and saga."""
    log.warning(
        "command %s (saga %s %s) at %s[%d] offset %d not handled (%s); its partition waits, "
        "the others go on",
        record.header(HEADER_MESSAGE_ID),
        record.header(HEADER_SAGA_TYPE),
        record.header(HEADER_SAGA_ID),
        record.topic,
        record.partition,
        record.offset,
        error,
    )


def _firsts(records: Sequence[Record]) -> dict[TP, int]:
    """Each partition's first offset among ``records``."""
    firsts: dict[TP, int] = {}
    for r in records:
        firsts.setdefault((r.topic, r.partition), r.offset)
    return firsts


def _by_partition(records: Sequence[Record]) -> dict[TP, list[Record]]:
    """``records`` by partition, each partition's in order, partitions in order of first sight."""
    groups: dict[TP, list[Record]] = {}
    for r in records:
        groups.setdefault((r.topic, r.partition), []).append(r)
    return groups


def _backoff(failures: int) -> float:
    return float(min(5.0, 0.2 * 2 ** min(failures, 5)))
