"""A confluent-kafka consumer made on first use.

A processor is built whole before it starts and connects only then (docs/architecture.md), so
its consumers keep their configuration until the first call that needs the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer

__all__ = ["LazyConsumer"]


class LazyConsumer:
    """A consumer made from ``conf`` when first asked for, and made anew by :meth:`replace`.

    Args:
        conf: The librdkafka configuration.

    Attributes:
        made: The consumer, once made; None before.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._conf = dict(conf)
        self.made: Consumer | None = None

    def get(self) -> Consumer:
        """The consumer, made now if it was not yet."""
        if self.made is None:
            self.made = Consumer(self._conf)
        return self.made

    def replace(self) -> Consumer:
        """Makes a new consumer; returns the one it replaces, for the caller to close."""
        old, self.made = self.get(), Consumer(self._conf)
        return old

    def close(self) -> None:
        """Closes the consumer, if one was made."""
        if self.made is not None:
            self.made.close()
