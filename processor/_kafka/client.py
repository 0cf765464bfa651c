"""Consumer and producer wrappers with the processor's settings and rebalance handling."""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from processor._engine.records import UNREADABLE_HEADERS, Record
from processor._errors import RuntimeFailure
from processor._kafka.group_view import describe_group
from processor._kafka.lazy import LazyConsumer
from processor._kafka.logs import client_logger

log = logging.getLogger(__name__)

TP = tuple[str, int]

# Seconds the broker has to tell one partition's high watermark to the lag gauge.
_MARKS_TIMEOUT = 2.0
# Seconds the broker has to describe the group to the membership watch (see _watch_membership).
_DESCRIBE_TIMEOUT = 2.0
# Group states in which no member is joining: one that is not listed then is not in the group.
_SETTLED = ("stable", "empty")


# Not msg.headers(): for a header name that is not valid UTF-8, confluent-kafka returns a list
# holding a NULL item *and* sets an exception. A plain call raises SystemError only until the
# interpreter specialises the call site (Python 3.11+); the specialised call checks the result
# with an assert that release builds drop, hands back the broken list, and the next read of it
# crashes the process. A call made through the C API (methodcaller) always checks it.
read_headers = operator.methodcaller("headers")


def to_record(msg: Any) -> Record:
    ts_type, ts = msg.timestamp()
    try:
        pairs = read_headers(msg)
        headers = _headers(pairs) if pairs else ()
    except (SystemError, UnicodeDecodeError):
        # A header name that is not valid UTF-8 (legal on the wire; Go, Java and C producers can
        # send one): confluent-kafka fails to make a str of it. The record goes on with a marker
        # in place of its headers, and decoding dead-letters it with its key and value intact.
        # The broken list stays inside the message object, never touched again.
        headers = UNREADABLE_HEADERS
    return Record(
        msg.topic(),
        msg.partition(),
        msg.offset(),
        msg.key(),
        msg.value(),
        headers,
        ts if ts_type != 0 else None,
    )


def _headers(pairs: list[tuple[str, bytes | None]]) -> tuple[tuple[str, bytes], ...]:
    # Once per record: copy the client's list as is unless a header has no value (rare).
    for _, value in pairs:
        if value is None:
            return tuple((k, v if v is not None else b"") for k, v in pairs)
    return tuple(pairs)  # type: ignore[arg-type]  # no None left, as just checked


class SagaConsumer:
    """A group member whose partition positions come from Postgres, not from Kafka."""

    def __init__(
        self,
        config: Mapping[str, str],
        *,
        group_id: str,
        topics: Sequence[str],
        on_assign: Callable[[list[TP]], Mapping[TP, int | None]],
        on_revoke: Callable[[list[TP]], None],
        session_timeout_ms: int = 45000,
        max_poll_interval_ms: int = 300000,
        max_batch_bytes: int = 16 * 1024 * 1024,
        metadata_refresh_ms: int = 300000,
    ) -> None:
        conf: dict[str, Any] = {
            # How soon the group sees partitions added to an input topic (and rebalances so
            # that they are assigned); a value in the given config wins.
            "topic.metadata.refresh.interval.ms": metadata_refresh_ms,
            **config,
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "partition.assignment.strategy": "cooperative-sticky",
            "auto.offset.reset": "earliest",
            # The position at a partition's end is past the transaction markers after its last
            # record, which no record's offset reaches; the worker stores it (see ends()).
            "enable.partition.eof": True,
            "session.timeout.ms": session_timeout_ms,
            "max.poll.interval.ms": max_poll_interval_ms,
            "heartbeat.interval.ms": min(3000, session_timeout_ms // 3),
            # Bounded memory: one fetch and the prefetch queue hold about two batches' bytes.
            "fetch.max.bytes": max(max_batch_bytes, 1_048_576),
            "queued.max.messages.kbytes": max(2 * max_batch_bytes // 1024, 1024),
            "logger": client_logger(),
        }
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._topics = list(topics)
        # Rebalances seen, by kind (assigned, revoked, lost), for the metrics endpoint.
        self.rebalances: Counter[str] = Counter()
        # Partitions assigned now: written on the consuming thread, read by the metrics sampler.
        self._assigned_tps: set[TP] = set()
        # The lag gauge's client (see high_watermarks), made on first use; the lock keeps
        # close() from destroying it under a query.
        self._marks_config = {
            **config,
            "group.id": f"{group_id}.watermarks",  # never joined
            "enable.auto.commit": False,
            "logger": client_logger(),
        }
        self._marks_client: Consumer | None = None
        self._marks_lock = threading.Lock()
        self._closed = False
        # Partitions that reached their end since the worker last asked, and where.
        self._ends: dict[TP, int] = {}
        # Seeks the client refused, by partition: tried again before each read (see seek).
        self._reseek: dict[TP, int | None] = {}
        self._refusals: dict[TP, int] = {}
        # The membership watch (see _watch_membership): it makes a client of its own, asks
        # the broker about the group from a process of its own, and needs the session's length.
        self._config = config
        self._group_id = group_id
        self._session = session_timeout_ms / 1000
        self._subscribed = False
        self._idle_since: float | None = None
        self._absent_since: float | None = None
        self._next_check = 0.0
        # Times the broker was asked whether the group goes on without this member.
        self.membership_checks = 0
        # Made, and subscribed, by the first consume(): a processor is built whole before it
        # starts, and joins the group only once it polls (a member that joins and does not
        # poll holds a rebalance up).
        self._client = LazyConsumer(conf)

    @property
    def _consumer(self) -> Consumer:
        return self._client.get()

    # Cooperative rebalancing hands over only the changed partitions; these callbacks must use
    # the incremental calls, or partitions are left unconsumed.
    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self._consumer:
            return  # a replaced client, closing: its partitions are no longer this member's
        tps = [(p.topic, p.partition) for p in partitions]
        self.rebalances["assigned"] += 1
        self._assigned_tps.update(tps)
        for tp in tps:
            # A fresh assignment starts where the worker says; an end read before is not its.
            self._ends.pop(tp, None)
        offsets = self._on_assign(tps) if tps else {}
        starts = [TopicPartition(t, p, _start(offsets.get((t, p)))) for t, p in tps]
        # librdkafka keeps a partition's pause through its revocation: one paused here before
        # (its claim waiting for the database) and assigned back later would never be fetched
        # again. A fresh assignment starts unpaused; resuming first keeps the start offset the
        # newer of the two operations (an older one is dropped as stale).
        consumer.resume(partitions)
        consumer.incremental_assign(starts)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self._consumer:
            consumer.incremental_unassign(partitions)  # a replaced client, closing
            return
        self.rebalances["revoked"] += 1
        self._unassign(consumer, partitions)

    def _lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The session expired: another member may own these already; forget them as revoked.
        if consumer is not self._consumer:
            consumer.incremental_unassign(partitions)  # a replaced client, closing
            return
        self.rebalances["lost"] += 1
        self._unassign(consumer, partitions)

    def _unassign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        self._assigned_tps.difference_update(tps)
        for tp in tps:
            # Neither a seek nor an end of the old ownership may reach a later assignment of
            # the partition: the worker would store that end as read while the records before
            # it are not (a replica given back its partitions read on, to their ends).
            self._reseek.pop(tp, None)
            self._refusals.pop(tp, None)
            self._ends.pop(tp, None)
        if tps:
            self._on_revoke(tps)
        consumer.incremental_unassign(partitions)

    @property
    def assigned(self) -> frozenset[TP]:
        """A copy of the partitions assigned to this member now (for metrics and reports)."""
        return frozenset(self._assigned_tps)

    def consume(self, max_records: int, timeout: float) -> list[Record]:
        if self._client.made is None:
            self.rejoin()
        out: list[Record] = []
        if self._assigned_tps:
            self._idle_since = self._absent_since = None
        elif self._subscribed:
            self._watch_membership()
        if self._reseek:
            self._seek_pending()
        # The seeks still refused are looked up as each message comes, not before the read:
        # the rebalance callbacks run inside it, and a partition revoked there (its refused
        # seek forgotten) and assigned again starts where the worker says; its records, held
        # back by a set taken before, would be skipped (found by the simulation, tests/sim).
        reseek = self._reseek
        for msg in self._read(max_records, timeout):
            err = msg.error()
            if err is None:
                if reseek and (msg.topic(), msg.partition()) in reseek:
                    # Read from wherever the failed seek left the fetch: the worker expects
                    # the position it asked for, so none of these may reach a batch.
                    continue
                out.append(to_record(msg))
            elif err.code() == KafkaError._PARTITION_EOF:
                tp = (str(msg.topic()), int(msg.partition() or 0))
                if tp not in reseek:
                    self._ends[tp] = int(msg.offset() or 0)
            else:
                if err.fatal():
                    # The consumer cannot go on; the process restarts (a fatal runtime failure).
                    raise RuntimeFailure(f"consumer failed: {err}")
                log.warning("consumer error: %s", err)
        return out

    def _read(self, max_records: int, timeout: float) -> list[Message]:
        """Up to ``max_records`` of what came, waiting at most ``timeout`` for a first record.

        What the client holds already is taken at once; when that holds no record, the read
        waits for one and takes what came with it. A batch never waits to fill: a record that
        came waits only for the batch in hand, and under load the records that arrive while a
        batch commits make the next one (the client fetches ahead), so batches stay as large
        as the load makes them. A read that waited for a full batch or the timeout held every
        record of a light load back by up to the timeout at every hop of a saga (commands,
        replies, deadlines: five hops for a transfer). Events (a partition's end, an error)
        are returned with the records, and do not end the wait.
        """
        consumer = self._consumer
        got = consumer.consume(num_messages=max_records, timeout=0)
        if timeout <= 0 or any(m.error() is None for m in got):
            return got
        ends = time.monotonic() + timeout
        while (left := ends - time.monotonic()) > 0:
            first = consumer.poll(left)
            if first is None:
                break
            got.append(first)
            if first.error() is None:
                room = max_records - len(got)
                if room > 0:
                    got.extend(consumer.consume(num_messages=room, timeout=0))
                break
        return got

    def ends(self) -> dict[TP, int]:
        ends, self._ends = self._ends, {}
        return ends

    def seek(self, tp: TP, offset: int | None) -> None:
        """Moves ``tp``'s next record to ``offset``; one the client refuses is tried again.

        The worker commits a batch's records as following the position it sought: were a seek
        lost, the records between that position and wherever the fetch was would be skipped
        with a commit that still matches. So a refused seek (a partition whose fetch has not
        started or is stopping) is kept and tried again before every read, and the
        partition's records are dropped until one succeeds or the partition is revoked.
        """
        self._ends.pop(tp, None)
        self._reseek.pop(tp, None)
        self._refusals.pop(tp, None)
        try:
            self._consumer.seek(TopicPartition(tp[0], tp[1], _start(offset)))
        except KafkaException as e:
            log.info(
                "seek of %s to %s refused (%s); trying again before the next read", tp, offset, e
            )
            self._reseek[tp] = offset

    def _seek_pending(self) -> None:
        """Tries the refused seeks again; those still refused stay in ``_reseek``."""
        for tp, offset in list(self._reseek.items()):
            try:
                self._consumer.seek(TopicPartition(tp[0], tp[1], _start(offset)))
            except KafkaException as e:
                tries = self._refusals[tp] = self._refusals.get(tp, 0) + 1
                if str(tries).strip("0") == "1":  # 1, 10, 100, ...: a read every poll
                    log.warning("seek of %s to %s refused %d times: %s", tp, offset, tries, e)
                continue
            del self._reseek[tp]
            self._refusals.pop(tp, None)

    def pause(self, tps: Sequence[TP]) -> None:
        self._consumer.pause([TopicPartition(t, p) for t, p in tps])

    def resume(self, tps: Sequence[TP]) -> None:
        self._consumer.resume([TopicPartition(t, p) for t, p in tps])

    def leave(self) -> None:
        # The revocation callback runs in a later consume(), like any rebalance.
        self._subscribed = False
        self._consumer.unsubscribe()

    def rejoin(self) -> None:
        self._consumer.subscribe(
            self._topics, on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
        )
        self._subscribed = True
        self._idle_since = self._absent_since = None

    def _watch_membership(self) -> None:
        """Replaces the Kafka client of a member the group has gone on without.

        After a broker restart, a librdkafka client was seen to give up its partitions when
        its session expired and then never rejoin: its requests to the group coordinator waited
        in a connection that never came up again (REQTMOUT with requests in the out-queue),
        while the broker served every other client. Such a member consumes nothing and looks
        alive. So while this member holds no partition, the broker is asked about the group
        once per session timeout, starting two session timeouts after the member last held one:
        a group that has settled (stable or empty, so no member is joining) without listing this
        member, seen so twice a session timeout apart, means the client is not coming back. A
        new client then joins in its place; the old one is closed on a thread of its own, since
        its close may wait on the same dead connection.

        A member the group lists with nothing assigned (more members than partitions) is left
        alone, and so is one that left on purpose (see leave).
        """
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < 2 * self._session or now < self._next_check:
            return
        self._next_check = now + self._session
        self.membership_checks += 1
        settled = self._settled_without_me()
        if settled is None:
            self._absent_since = None
        elif self._absent_since is None:
            self._absent_since = now
        elif now - self._absent_since >= self._session:
            self._replace(now - self._idle_since, settled)

    def _settled_without_me(self) -> str | None:
        """The group's state if it is settled and does not list this member, else None."""
        me = self._consumer.memberid() or ""
        # From a process of its own: see processor._kafka.group_view.
        group = describe_group(self._config, self._group_id, _DESCRIBE_TIMEOUT)
        if group is None:  # the broker is away: a healthy client is waiting for it too
            return None
        if group.state not in _SETTLED or me in group.members:
            return None
        return f"{group.state}, {len(group.members)} member(s)"

    def _replace(self, idle: float, settled: str) -> None:
        log.warning(
            "group %s: this member has held no partition for %.0f s and the group (%s) has "
            "gone on without it; replacing its Kafka client",
            self._group_id,
            idle,
            settled,
        )
        self.rebalances["replaced"] += 1
        old = self._client.replace()
        self.rejoin()
        threading.Thread(
            target=_close_quietly, args=(old,), name="consumer-close", daemon=True
        ).start()

    def commit_advisory(self, offsets: Mapping[TP, int]) -> None:
        """Mirrors stored positions to Kafka so lag tools work; Postgres stays the authority."""
        if offsets:
            try:
                self._consumer.commit(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                    asynchronous=True,
                )
            except KafkaException as e:
                log.debug("advisory commit skipped: %s", e)

    def high_watermarks(self, tps: Sequence[TP]) -> dict[TP, int]:
        """The broker's high watermark of each of ``tps`` assigned here, for the lag gauge.

        Asked of the broker each time, through a client of its own: the consuming client's
        cached values are only as fresh as its last fetch of a partition, so one it no longer
        fetches (paused, or stalled) would look caught up while it falls behind. And the
        consuming client admits one calling thread at a time, so the sampler would wait on the
        worker's polls. Partitions not assigned here are left out.

        Raises:
            KafkaException: The broker did not answer in time.
        """
        assigned = self.assigned  # a copy: the consuming thread changes the set
        wanted = [tp for tp in tps if tp in assigned]
        with self._marks_lock:
            if self._closed or not wanted:
                return {}
            if self._marks_client is None:
                self._marks_client = Consumer(self._marks_config)
            client = self._marks_client
            marks: dict[TP, int] = {}
            for t, p in wanted:
                _low, high = client.get_watermark_offsets(
                    TopicPartition(t, p), timeout=_MARKS_TIMEOUT, cached=False
                )
                marks[(t, p)] = int(high)
            return marks

    def close(self) -> None:
        with self._marks_lock:
            self._closed = True
            marks_client, self._marks_client = self._marks_client, None
        if marks_client is not None:
            marks_client.close()
        self._client.close()


def _close_quietly(consumer: Consumer) -> None:
    try:
        consumer.close()
    except Exception as e:  # a replaced client: nothing depends on how its close ends
        log.debug("replaced consumer closed with: %s", e)


def _start(offset: int | None) -> int:
    # No stored position yet: a new partition is read from its beginning, so nothing is lost.
    return OFFSET_BEGINNING if offset is None else offset
