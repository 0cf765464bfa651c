"""The record producer: produces a batch in order and waits for every acknowledgement.

It says which records failed and whether sending them again could ever succeed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from processor._engine.partitioner import LIBRDKAFKA_NAMES, Partitioner
from processor._engine.records import OutboxRow
from processor._errors import Retryable, SendFailure
from processor._kafka.logs import client_logger

log = logging.getLogger(__name__)

# Errors for which the same record can never be accepted as it is: too large, a topic that does
# not exist, a refused authorization, a record the broker calls invalid.
_PERMANENT = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_MSG,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError._INVALID_ARG,
    }
)


# The client remembers a topic it found missing until its next metadata refresh (minutes): a
# producer that refused one must not refuse it again once an operator created it.
_UNKNOWN_TOPIC = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)


def is_permanent(error: KafkaError) -> bool:
    """Whether sending the same record again cannot succeed."""
    return error.code() in _PERMANENT


def make_producer(
    config: Mapping[str, str], *, partitioner: Partitioner, **overrides: Any
) -> Producer:
    """An idempotent producer: per-partition order kept across retries, no duplicates from them.

    ``partitioner`` (``SAGA_CONSUMER__PARTITIONER``) places keyed records without a partition:
    a participant's replies, commands to topics other processes read. It must be the one the
    input topics' producers use, or a saga's replies land on another partition than its events.
    """
    conf: dict[str, Any] = {
        **config,
        "partitioner": LIBRDKAFKA_NAMES[partitioner],
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 30000,
        # A hole in the sequence would reorder a saga's commands; fail fatally instead, and the
        # sender recreates the producer and sends again from the outbox.
        "enable.gapless.guarantee": True,
        # Callers learn of failures through delivery reports and of success from a flush that
        # leaves nothing queued; skipping success reports saves a Python call per record.
        "delivery.report.only.error": True,
        "logger": client_logger(),
        # Topics are created by whoever deploys the sagas: a record for a topic that does not
        # exist is refused (unknown topic) rather than creating one with the broker's defaults,
        # and refused after a few seconds, not after message.timeout.ms.
        "allow.auto.create.topics": False,
        "topic.metadata.propagation.max.ms": 5000,
    }
    conf.update(overrides)
    return Producer(conf)


def relay_overrides(max_record_bytes: int) -> dict[str, Any]:
    """Producer settings for the outbox relay, which sets refused records aside itself.

    The relay sends a saga's rows in waves (a row only once the saga's earlier one was
    acknowledged), so the gap a refused record leaves cannot reorder a saga; with the gap-less
    guarantee, one record the broker refuses (a topic's lower size limit) would stop the
    producer for every saga.
    """
    return {"enable.gapless.guarantee": False, "message.max.bytes": max_record_bytes}


def _delivered(
    failures: list[SendFailure],
    missing: list[int],
    index: int,
    err: KafkaError | None,
    _msg: object,
) -> None:
    if err is not None:
        failures.append(SendFailure(index, str(err), is_permanent(err)))
        if err.code() in _UNKNOWN_TOPIC:
            missing.append(index)


class KafkaRecordProducer:
    """:class:`processor._ports.RecordProducer` over confluent-kafka."""

    def __init__(self, factory: Callable[[], Producer]) -> None:
        self._factory = factory
        # Made on first send: a processor is built whole before it starts, and connects then.
        self._producer: Producer | None = None

    def send(self, records: Sequence[OutboxRow], timeout: float) -> list[SendFailure]:
        failures: list[SendFailure] = []
        missing: list[int] = []
        producer = self._producer
        if producer is None:
            producer = self._producer = self._factory()

        try:
            for index, row in enumerate(records):
                headers = row.headers
                try:
                    self._produce(
                        producer,
                        row,
                        # The client encodes str header values itself, in C; it takes a dict as
                        # is.
                        headers if type(headers) is dict else dict(headers),
                        # Called only for a failed record (delivery.report.only.error), with its
                        # position bound now.
                        partial(_delivered, failures, missing, index),
                    )
                except KafkaException as e:
                    err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                    if err is None or err.fatal() or not is_permanent(err):
                        raise
                    # Refused before it left (e.g. larger than message.max.bytes).
                    failures.append(SendFailure(index, str(err), True))
                    if err.code() in _UNKNOWN_TOPIC:
                        missing.append(index)
            remaining = producer.flush(timeout)
        except KafkaException as e:
            self._recreate(e)
            raise Retryable(f"producer failed: {e}") from e
        if remaining:
            # Not acknowledged in time: which ones is unknown, so none counts as sent.
            failed = {f.index for f in failures}
            failures.extend(
                SendFailure(i, "not acknowledged in time", False)
                for i in range(len(records))
                if i not in failed
            )
            self._recreate("acknowledgements timed out")
        elif any(not f.permanent for f in failures):
            # A fatal idempotence error leaves the producer unusable for every later record.
            self._recreate(failures[0].reason)
        elif missing:
            self._recreate(f"a topic does not exist: {records[missing[0]].topic}")
        failures.sort(key=lambda f: f.index)
        return failures

    @staticmethod
    def _produce(
        producer: Producer,
        row: OutboxRow,
        headers: dict[str, Any],
        on_delivery: Callable[[KafkaError | None, object], None],
    ) -> None:
        while True:
            try:
                # Positional value and key, and no keyword dict to unpack: this runs per row.
                if row.partition is None:
                    producer.produce(
                        row.topic, row.value, row.key, on_delivery=on_delivery, headers=headers
                    )
                else:
                    producer.produce(
                        row.topic,
                        row.value,
                        row.key,
                        row.partition,
                        on_delivery=on_delivery,
                        headers=headers,
                    )
                return
            except BufferError:
                # Local queue full: let deliveries drain, then go on with the same record.
                producer.poll(0.1)

    def _recreate(self, cause: object) -> None:
        # The records stay where they came from (outbox, deadline rows), so a fresh producer
        # sends them again, in order, under the same message ids.
        log.warning("recreating a producer after: %s", cause)
        self._producer = self._factory()

    def close(self, timeout: float) -> None:
        if self._producer is not None:
            self._producer.flush(timeout)
