"""What a Kafka client error means for a command line: the cluster out of reach, or not."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

__all__ = ["unreachable"]

# librdkafka's local codes for a cluster that did not answer: no connection, no broker up, a
# name that does not resolve, a request that timed out.
_UNREACHABLE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._MSG_TIMED_OUT,
    }
)


def unreachable(e: BaseException) -> str | None:
    """One line saying the Kafka cluster did not answer, when that is what ``e`` means.

    The client's error is looked for in ``e`` and its causes: the adapters raise their own
    failures ``from`` it.
    """
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, KafkaException) and seen.args and isinstance(seen.args[0], KafkaError):
            error: KafkaError = seen.args[0]
            if error.code() in _UNREACHABLE:
                return f"the Kafka cluster did not answer: {error.str()}"
            return None
        seen = seen.__cause__
    return None
