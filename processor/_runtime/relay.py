"""Publishes outbox rows to Kafka, in order per saga, at least once; one bad row stops no other.

A round claims up to batch-size committed rows in id order: the rows caused by records of the
input partitions this replica owns (fenced by the owner epochs, so a partition's relaying moves
with it), and the rows of no partition when no other relay holds them; a row whose saga still
has an older row of another source waits for that row's relay. It sends them and settles each
row in the claim's transaction:

- acknowledged: removed;
- refused for good (too large, unknown topic, not authorized), or failed with a transient error
  in ``max_attempts`` rounds: moved to the failed outbox with the reason, and logged once;
- every later row of the same saga: held in the failed outbox behind it, in order, until an
  operator retries or discards them; rows of other sagas, and rows of no saga (dead letters),
  go on flowing;
- failed with a transient error fewer times: kept for a later round (with the saga's later rows
  behind it), and the loop backs off before that round.

Per-saga order: a round sends in waves. Wave k holds the k-th row of each saga in the round (and
every row of no saga in the first), and goes out only once wave k-1 was acknowledged, so a
saga's later row never reaches the broker before an earlier one failed. A row that failed for
good in a wave with other failures of the same topic may have been refused with them (the broker
refuses a whole request); it is kept and sent alone in a later round, where a refusal is its own.
A round in which nothing was acknowledged and nothing refused for good is an outage: it rolls
back without counting any attempt, so that a broker restart never fills the failed outbox.

The relay speaks only to the ports: :class:`processor._ports.OutboxStore` and
:class:`processor._ports.RecordProducer`. What to do about a failure is decided from its class.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from processor._engine.records import OutboxRow
from processor._errors import DeliveryFailed, Retryable, SendFailure
from processor._observe.repeats import RepeatedWarning
from processor._observe.tracing import MAX_LINKS, Tracing
from processor._ports import TP, OutboxEntry, OutboxStore, RecordProducer, SetAside
from processor._runtime.heartbeat import beat
from processor._runtime.hooks import HookPoint, Hooks
from processor._wire import (
    HEADER_DEAD_LETTER_REASON,
    HEADER_DEAD_LETTER_TRUNCATED,
    HEADER_MESSAGE_ID,
)

__all__ = ["HEADER_DEAD_LETTER_TRUNCATED", "Relay", "fits", "record_size"]

log = logging.getLogger(__name__)

# Per header, what the record format adds to the name and value (length varints).
_HEADER_OVERHEAD = 10
# What the client adds per record (and per batch) before comparing with message.max.bytes.
_RECORD_OVERHEAD = 512
# Rows set aside per round for being sent alone (suspects); the rest wait for later rounds.
_SOLO_PER_ROUND = 10

SagaKey = tuple[str | None, str]


def record_size(row: OutboxRow) -> int:
    """The bytes the producer counts against ``message.max.bytes``, with a margin per header."""
    headers = sum(len(k) + len(v.encode()) + _HEADER_OVERHEAD for k, v in row.headers.items())
    return len(row.value) + len(row.key or b"") + headers + _RECORD_OVERHEAD


def fits(row: OutboxRow, limit: int) -> bool:
    """Whether ``record_size(row) <= limit``, without encoding each header when it clearly is.

    A character is at most 4 bytes of UTF-8, so counting each header character as 4 bytes gives
    a bound; only a row near the limit has its headers encoded.
    """
    h = row.headers
    chars = sum(map(len, h)) + sum(map(len, h.values()))
    bound = len(row.value) + len(row.key or b"") + _RECORD_OVERHEAD
    return bound + 4 * chars + _HEADER_OVERHEAD * len(h) <= limit or record_size(row) <= limit


@dataclass
class _Round:
    """What one round decided, row by row."""

    blocked: dict[SagaKey, int] = field(default_factory=dict)
    waiting: set[SagaKey] = field(default_factory=set)
    set_aside: list[SetAside] = field(default_factory=list)
    kept: dict[int, str | None] = field(default_factory=dict)
    failures: list[SendFailure] = field(default_factory=list)
    acknowledged: int = 0
    refused: int = 0


class Relay:
    """The outbox relay: :meth:`run_once` publishes one round; :meth:`run` loops until stopped.

    Args:
        outbox: Where committed outbox rows are claimed.
        producer: Sends records and reports the ones not acknowledged.
        batch_size: Most rows claimed in one round.
        max_batch_bytes: Most bytes of keys and values claimed in one round (a larger row is
            claimed alone): what one round holds in memory, whatever the rows' sizes.
        poll_interval: Seconds to wait for a wake-up when a round found less than a full batch.
        flush_timeout: Seconds to wait for one wave's acknowledgements.
        max_attempts: Rounds a row may fail with a transient error before it is set aside.
        max_record_bytes: Largest record sent; a larger command is set aside without being
            sent, a larger dead letter is sent with its value cut (the stored row keeps it).
        hooks: Fault points: ``relay-round`` at the start of each round, ``after-produce`` once
            every record of a round was sent but before its rows are settled.
        owned: The input partitions this replica owns, with their owner epochs, read at the
            start of each round (from any thread); None relays only rows of no partition.
        drain_on_stop: When given, a stopped relay waits for it to be set (the last batch is
            committed; at most ``flush_timeout``), then publishes what is committed before it
            ends: rows a replica committed just before a graceful stop go out now rather than
            when a replica next starts. None: it ends at once.
        tracing: A span per round when OpenTelemetry is configured (_observe/tracing.py).

    Attributes:
        wake: Set it to start the next round at once (a commit wrote outbox rows).
        published: Rows published and removed since start.
        set_aside: Rows moved to the failed outbox since start.
        last_failures: The transient failures of the last round (empty when it went through).
    """

    def __init__(
        self,
        outbox: OutboxStore,
        producer: RecordProducer,
        *,
        batch_size: int = 1000,
        max_batch_bytes: int = 16 * 1024 * 1024,
        poll_interval: float = 1.0,
        flush_timeout: float = 60.0,
        max_attempts: int = 10,
        max_record_bytes: int = 1_000_000,
        hooks: Hooks | None = None,
        owned: Callable[[], Mapping[TP, int]] | None = None,
        drain_on_stop: threading.Event | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._outbox = outbox
        self._owned = owned
        self._producer = producer
        self.batch_size = batch_size
        self.max_batch_bytes = max_batch_bytes
        # Whether the last round took as much as a round may: more rows may be waiting.
        self.last_round_full = False
        self.poll_interval = poll_interval
        self.flush_timeout = flush_timeout
        self.max_attempts = max_attempts
        self.max_record_bytes = max_record_bytes
        self._hooks = hooks if hooks is not None else Hooks()
        self.wake = threading.Event()
        self.published = 0
        self.set_aside = 0
        # Rounds that left rows in the outbox, by reason (for the metrics endpoint).
        self.failed_rounds: Counter[str] = Counter()
        self.tracing = tracing
        self.last_failures: list[SendFailure] = []
        self.drain_on_stop = drain_on_stop

    def wake_for(self, partitions: Collection[TP] | None = None) -> None:
        """Wakes the relay for rows just committed for ``partitions`` (None: anywhere)."""
        self._outbox.expect(partitions)
        self.wake.set()

    def run_once(self) -> int:
        """Publishes up to batch-size rows; sets aside the ones that cannot be published.

        Returns:
            The rows published; 0 when the outbox was empty or another relay holds the lock.

        Raises:
            DeliveryFailed: Nothing was acknowledged and nothing refused for good (the broker
                is out of reach); every row of the round stays, no attempt counted.
            Retryable: The store or the producer failed; every row of the round stays.
        """
        self._hooks.fire(HookPoint.RELAY_ROUND)
        self.last_failures = []
        owned = self._owned() if self._owned is not None else None
        self.last_round_full = False
        with self._outbox.claim(self.batch_size, owned, max_bytes=self.max_batch_bytes) as entries:
            if not entries:
                # One worker's turn came up empty (tables by bucket): the next one's may not.
                self.last_round_full = self._outbox.more_waiting
                return 0
            held = sum(len(e.row.value) + len(e.row.key or b"") for e in entries)
            self.last_round_full = (
                len(entries) >= self.batch_size
                or held >= self.max_batch_bytes
                or self._outbox.more_waiting
            )
            if self.tracing is not None:
                links = [e.row.headers for e in entries[:MAX_LINKS]]
                with self.tracing.span("saga.relay.publish", links=links):
                    r = self._publish(entries)
            else:
                r = self._publish(entries)
            if r.failures and not r.acknowledged and not r.refused:
                # Raised inside the claim, so that the round rolls back with no attempt counted.
                raise DeliveryFailed(r.failures)
            self._hooks.fire(HookPoint.AFTER_PRODUCE)
            self._outbox.settle(r.set_aside, r.kept)
        # Logged once the move committed: each failed row is logged exactly once.
        if r.set_aside:
            by_id = {e.id: e for e in entries}
            for s in sorted(r.set_aside, key=lambda s: s.id):
                _log_set_aside(by_id[s.id].row, s)
        published = len(entries) - len(r.set_aside) - len(r.kept)
        self.published += published
        self.set_aside += len(r.set_aside)
        self.last_failures = r.failures
        return published

    def _publish(self, entries: Sequence[OutboxEntry]) -> _Round:
        r = _Round()
        waves: list[list[OutboxEntry]] = []
        solo: list[OutboxEntry] = []
        depth: defaultdict[SagaKey, int] = defaultdict(int)
        for claimed in entries:
            e = claimed
            key = _saga_key(e.row)
            if key is not None and e.behind is not None:
                r.blocked.setdefault(key, e.behind)
            if self._hold(r, e, key):
                continue
            if not fits(e.row, self.max_record_bytes):
                if key is None and HEADER_DEAD_LETTER_REASON in e.row.headers:
                    e = replace(e, row=self._truncated(e.row))
                else:
                    size = record_size(e.row)
                    self._fail(r, e, key, f"record of {size} bytes over {self.max_record_bytes}")
                    continue
            if e.attempts and len(solo) < _SOLO_PER_ROUND:
                solo.append(e)
                if key is not None:
                    depth[key] += 1
                continue
            if e.attempts and key is not None:
                r.kept[e.id] = None
                r.waiting.add(key)
                continue
            k = depth[key] if key is not None else 0
            if key is not None:
                depth[key] += 1
            while len(waves) <= k:
                waves.append([])
            waves[k].append(e)
        # Rows that failed before go first, each alone: a refusal of a lone record is its own.
        pending: list[list[OutboxEntry]] = [[e] for e in solo] + waves
        for wave in pending:
            self._send(r, [e for e in wave if not self._hold(r, e, _saga_key(e.row))])
        return r

    def _send(self, r: _Round, wave: list[OutboxEntry]) -> None:
        if not wave:
            return
        failures = self._producer.send([e.row for e in wave], self.flush_timeout)
        by_index = {f.index: f for f in failures}
        refused_topics: defaultdict[str, int] = defaultdict(int)
        for failure in failures:
            if failure.permanent:
                refused_topics[wave[failure.index].row.topic] += 1
        for i, e in enumerate(wave):
            key = _saga_key(e.row)
            f = by_index.get(i)
            if f is None:
                r.acknowledged += 1
            elif f.permanent and (len(wave) == 1 or refused_topics[e.row.topic] == 1):
                r.refused += 1
                self._fail(r, e, key, f.reason)
            elif e.attempts + 1 >= self.max_attempts:
                r.refused += 1
                self._fail(r, e, key, f"{f.reason} (after {e.attempts + 1} attempts)")
            else:
                if f.permanent:
                    # Refused for good, maybe only for another record of the same request:
                    # not an outage, and a lone retry will tell.
                    r.refused += 1
                r.failures.append(f)
                r.kept[e.id] = f.reason
                if key is not None:
                    r.waiting.add(key)

    def _hold(self, r: _Round, e: OutboxEntry, key: SagaKey | None) -> bool:
        """Sets ``e`` aside or keeps it when an earlier row of its saga did not go out."""
        if key is None:
            return False
        failed = r.blocked.get(key)
        if failed is not None:
            reason = f"held behind failed outbox row {failed}"
            r.set_aside.append(SetAside(e.id, reason, e.attempts, held_behind=failed))
            return True
        if key in r.waiting:
            r.kept[e.id] = None
            return True
        return False

    def _fail(self, r: _Round, e: OutboxEntry, key: SagaKey | None, reason: str) -> None:
        r.set_aside.append(SetAside(e.id, reason, e.attempts + 1))
        if key is not None:
            r.blocked[key] = e.id

    def _truncated(self, row: OutboxRow) -> OutboxRow:
        headers = {**row.headers, HEADER_DEAD_LETTER_TRUNCATED: str(len(row.value))}
        room = self.max_record_bytes - record_size(replace(row, value=b"", headers=headers))
        return replace(row, value=row.value[: max(0, room)], headers=headers)

    def run(self, stop: threading.Event) -> None:
        """Publishes rounds until ``stop`` is set.

        Transient failures back off and try again; any other failure ends the loop (and its
        thread) with the exception.
        """
        failures = 0
        repeated = RepeatedWarning(log, "relay")
        while not stop.is_set():
            beat()
            try:
                self.run_once()
            except (Retryable, DeliveryFailed) as e:
                self.failed_rounds["broker" if isinstance(e, DeliveryFailed) else "store"] += 1
                failures += 1
                repeated.failed("relay round failed (%s); rows stay in the outbox", e)
                stop.wait(min(5.0, 0.2 * 2 ** min(failures, 5)))
                continue
            repeated.succeeded()
            if self.last_failures:
                # Some rows stay for another try: never send them again in a tight loop.
                self.failed_rounds["partial"] += 1
                failures += 1
                stop.wait(min(5.0, 0.2 * 2 ** min(failures, 5)))
                continue
            failures = 0
            if not self.last_round_full:
                self.wake.wait(self.poll_interval)
                self.wake.clear()
        if self.drain_on_stop is not None:
            self._drain(self.drain_on_stop)
        self._producer.close(5.0)

    def _drain(self, committed: threading.Event) -> None:
        """Once ``committed`` is set, publishes the rows committed before the stop.

        Waits at most one ``flush_timeout`` for the cue, then rounds for at most another.
        """
        if not committed.wait(self.flush_timeout):
            return
        ends = time.monotonic() + self.flush_timeout
        published = 0
        try:
            while time.monotonic() < ends:
                n = self.run_once()
                published += n
                if not self.last_round_full or self.last_failures:
                    break
        except Exception as e:  # the rows stay for the next start; the stop goes on
            log.warning("relay stopped before publishing every committed row: %s", e)
        if published:
            log.info("relay published %d rows committed before the stop", published)

    def close(self) -> None:
        """Releases the store's connection."""
        self._outbox.close()


def _saga_key(row: OutboxRow) -> SagaKey | None:
    # Rows of no saga (dead letters) are independent of each other.
    return None if row.saga_id is None else (row.saga_type, row.saga_id)


def _log_set_aside(row: OutboxRow, s: SetAside) -> None:
    log.warning(
        "outbox row %d set aside: saga %s %s, message-id %s, topic %s, attempts %d: %s",
        s.id,
        row.saga_type or "-",
        row.saga_id or "-",
        row.headers.get(HEADER_MESSAGE_ID),
        row.topic,
        s.attempts,
        s.reason,
    )
