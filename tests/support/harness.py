"""Runs processors and talks Kafka the way other services would, for integration tests."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import psycopg
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from processor._authoring.messages import (
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SCHEMA_VERSION,
    Message,
    registry,
)
from processor._bootstrap.processor import build_processor
from processor._runtime.processor import Processor
from processor.publish import EventPublisher
from processor.settings import ProcessorSettings
from tests.support.phases import CITUS_BUCKETS, CITUS_LAYOUT

T = TypeVar("T")


def settings_for(
    kafka: str, database_url: str, schema: str, prefix: str, **extra: Any
) -> ProcessorSettings:
    """Processor settings that touch only this test's topics and schema."""
    base: dict[str, Any] = {
        # The example sagas; the processor has no default.
        "sagas": ["sagas"],
        "kafka": {"bootstrap_servers": kafka},
        "database": {"url": database_url, "schema_name": schema},
        "consumer": {
            "group_id": f"{prefix}group",
            "batch_timeout": "50ms",
            "session_timeout": "6s",
        },
        "relay": {"poll_interval": "200ms"},
        "deadline": {"polling": {"interval": "1s"}, "lease_ttl": "4s", "redispatch_after": "3s"},
        "topic_prefix": prefix,
        "shutdown_timeout": "10s",
        # Any free port: several processors run on one machine (see Processor.metrics_port).
        "metrics": {"bind_any": True, "host": "127.0.0.1", "sample_interval": "300ms"},
    }
    if os.environ.get(CITUS_LAYOUT) == "buckets":
        # The Citus phase run again with the tables distributed by bucket (tests/run.py).
        base["database"].update(distributed="buckets", buckets=CITUS_BUCKETS)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return ProcessorSettings(**base)


def create_topics(kafka: str, names: Sequence[str], partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": kafka})
    futures = admin.create_topics([NewTopic(n, partitions, 1) for n in names], operation_timeout=30)
    for future in futures.values():
        try:
            future.result()
        except Exception as e:  # an existing topic is fine
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise
    until_visible(admin, names)


def until_visible(admin: AdminClient, names: Sequence[str], timeout: float = 30.0) -> None:
    """Waits until the broker's metadata has each topic.

    The controller acknowledges a creation before the broker's metadata shows it: a request
    about the topic right after (altering its configs, producing) may meet UNKNOWN_TOPIC.
    """

    def seen() -> bool:
        topics = admin.list_topics(timeout=5).topics
        return all(n in topics and topics[n].error is None and topics[n].partitions for n in names)

    wait_until(seen, timeout, f"topics {list(names)} in the broker's metadata")


@contextmanager
def running(
    settings: ProcessorSettings, sagas: Sequence[type[Any]] | None = None, **kw: Any
) -> Iterator[Processor]:
    """A processor consuming in a background thread; stopped (gracefully) on exit."""
    proc = build_processor(settings, sagas, **kw)
    proc.start()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            proc.run()
        except BaseException as e:  # surfaced to the test below
            errors.append(e)

    thread = threading.Thread(target=target, name="processor", daemon=True)
    thread.start()
    try:
        yield proc
    finally:
        proc.stop()
        thread.join(30)
    assert not thread.is_alive(), "processor did not stop within 30 s"
    assert not errors, errors


def headers_for(
    message: Message, message_id: str | None = None, **extra: str
) -> list[tuple[str, bytes]]:
    mtype = registry.of(type(message))
    base = {
        HEADER_MESSAGE_ID: message_id or str(uuid.uuid4()),
        HEADER_MESSAGE_TYPE: mtype.name,
        HEADER_SCHEMA_VERSION: str(mtype.version),
        HEADER_OCCURRED_AT: datetime.now(UTC).isoformat(),
        **extra,
    }
    return [(k, v.encode()) for k, v in base.items()]


class Publisher:
    """Publishes events as an upstream service would: through the event publisher.

    ``raw`` sends hand-made records on the same producer, so that they keep their order with
    the events sent through ``event``.
    """

    def __init__(self, kafka: str) -> None:
        self.events = EventPublisher({"bootstrap.servers": kafka})
        self.errors: list[KafkaError] = []

    @property
    def producer(self) -> Producer:
        return cast(Producer, self.events.producer)

    def event(
        self, topic: str, key: str, message: Message, message_id: str | None = None, **headers: str
    ) -> None:
        # The publisher sets these from its own arguments; tests name them as headers.
        correlation = headers.pop("correlation-id", None)
        causation = headers.pop("causation-id", None)
        self.events.publish(
            message,
            key=key,
            message_id=message_id,
            topic=topic,
            headers=headers,
            correlation_id=correlation,
            causation_id=causation,
        )

    def raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]],
    ) -> None:
        self.producer.produce(
            topic, key=key, value=value, headers=[*headers], on_delivery=self._delivered
        )

    def _delivered(self, err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            self.errors.append(err)

    def flush(self) -> None:
        # Raises PublishFailed naming any event the broker did not take.
        self.events.flush(30)
        assert len(self.producer) == 0
        assert not self.errors, self.errors


class Reader:
    """Reads topics from their beginning, collecting every record seen, each once.

    Not a group member: it assigns itself every partition of its topics and keeps its own
    positions. Partitions added later, and topics created later, are taken up at the next poll
    after their metadata is read again (about every second). A group member would be polled only
    while a test waits on it: its session could time out meanwhile (during a broker restart),
    and its next assignment would start over from the beginning, reading every record twice, or
    never come.
    """

    REFRESH = 1.0
    """Seconds between reads of the topics' metadata."""
    STALL = 10.0
    """Seconds without a record, while a log it reads has records past its position, after
    which the client is taken as wedged and replaced. After a broker restart librdkafka can
    keep a partition without a leader for good (librdkafka #5430): it holds the partition and
    fetches nothing, and a test would wait on it in vain."""

    def __init__(self, kafka: str, topics: Sequence[str]) -> None:
        self._kafka = kafka
        self.consumer = self._client()
        self.records: list[Any] = []
        self.replaced = 0
        self._topics = list(topics)
        self._assigned: set[tuple[str, int]] = set()
        # The next offset to read of each partition a record came from.
        self._next: dict[tuple[str, int], int] = {}
        self._progress = time.monotonic()
        self._refreshed: float | None = None
        self._take_new_partitions()

    def _client(self) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self._kafka,
                "group.id": f"reader-{uuid.uuid4().hex}",  # never joined: no positions stored
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )

    def follow(self, topics: Sequence[str]) -> None:
        """Reads ``topics`` from now on (those already read go on where they are)."""
        self._topics = list(topics)
        self._refreshed = None

    def _take_new_partitions(self) -> None:
        now = time.monotonic()
        if self._refreshed is not None and now - self._refreshed < self.REFRESH:
            return
        self._refreshed = now
        new: list[tuple[str, int]] = []
        for name in self._topics:
            try:
                found = self.consumer.list_topics(name, timeout=2).topics.get(name)
            except KafkaException:
                continue  # the broker is away: the next poll asks again
            if found is None or found.error is not None:
                continue  # not created yet
            new += [(name, p) for p in sorted(found.partitions) if (name, p) not in self._assigned]
        if new:
            self.consumer.incremental_assign(
                [TopicPartition(t, p, OFFSET_BEGINNING) for t, p in new]
            )
            self._assigned.update(new)

    def poll(self, timeout: float = 0.2) -> None:
        self._take_new_partitions()
        for msg in self.consumer.consume(num_messages=1000, timeout=timeout):
            if msg.error() is None:
                self.records.append(msg)
                key = (cast(str, msg.topic()), cast(int, msg.partition()))
                self._next[key] = cast(int, msg.offset()) + 1
                self._progress = time.monotonic()
        if time.monotonic() - self._progress > self.STALL:
            self._progress = time.monotonic()
            if self._behind():
                self._replace()

    def _behind(self) -> bool:
        """Whether a log this reader reads has records past where it stands."""
        for topic, partition in self._assigned:
            try:
                low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=2, cached=False
                )
            except KafkaException:
                return False  # the broker is away: nothing to judge by
            if high > max(low, self._next.get((topic, partition), 0)):
                return True
        return False

    def _replace(self) -> None:
        """A new client at the same positions; the old one is closed aside (its close can hang
        on the connection that wedged it)."""
        old, self.consumer = self.consumer, self._client()
        self.consumer.assign(
            [
                TopicPartition(t, p, self._next.get((t, p), OFFSET_BEGINNING))
                for t, p in sorted(self._assigned)
            ]
        )
        self.replaced += 1
        threading.Thread(target=old.close, name="reader-close", daemon=True).start()

    def headers(self, msg: Any) -> dict[str, str]:
        return {k: v.decode() for k, v in (msg.headers() or [])}

    def wait_for(
        self, predicate: Callable[[list[Any]], bool], timeout: float = 60.0, what: str = "records"
    ) -> list[Any]:
        deadline = time.monotonic() + timeout
        while not predicate(self.records):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what}; have {len(self.records)} records"
                )
            self.poll()
        return self.records

    def close(self) -> None:
        self.consumer.close()


def wait_until(check: Callable[[], T], timeout: float = 60.0, what: str = "condition") -> T:
    """Polls `check` until it returns a truthy value, or fails with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what} (last: {value!r})"
            )
        time.sleep(0.05)


def query(database_url: str, schema: str, sql_text: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url, options=f"-c search_path={schema}") as conn:
        return conn.execute(sql_text, args).fetchall()
