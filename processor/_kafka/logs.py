"""librdkafka's own log lines, routed through Python logging with the expected ones explained.

Without a logger librdkafka writes to stderr, outside the application's log format and levels.
Some of its warnings are expected for how the processor configures the client; those are
explained once at INFO instead of repeated at WARNING by every client the process creates.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

# Substring of an expected warning -> why it is expected.
EXPECTED = {
    "enable.gapless.guarantee is experimental": (
        "the idempotent producer runs with enable.gapless.guarantee, so a gap in a partition's "
        "sequence fails the producer instead of reordering commands; the client calls the "
        "option experimental"
    ),
}

# A name operators configure, so it stays put whatever module holds this code.
LOGGER_NAME = "processor.librdkafka"

# Substrings of the lines a client logs while the broker is not up yet (start) or already gone
# (teardown): expected then, retried by the client, and reported by the loops if they last.
BROKER_AWAY = (
    "Connection refused",
    "Connect to ipv4",
    "Connect to ipv6",
    "brokers are down",
    "Disconnected",
    "Broker transport failure",
    "Failed to resolve",
)


class _Expected(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self._explained: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.levelno > logging.DEBUG and any(n in text for n in BROKER_AWAY):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            # The logger was asked at the original level; ask again at the new one.
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        for needle, why in EXPECTED.items():
            if needle in text:
                # Lowered to INFO, it shows only where INFO does: a command at its default
                # WARNING prints its answer alone.
                if needle in self._explained or not logging.getLogger(record.name).isEnabledFor(
                    logging.INFO
                ):
                    return False
                self._explained.add(needle)
                record.levelno, record.levelname = logging.INFO, "INFO"
                record.msg, record.args = "expected client notice: %s", (why,)
                return True
        return True


def client_logger() -> logging.Logger:
    """The logger every Kafka client of the processor hands to librdkafka."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(f, _Expected) for f in logger.filters):
        logger.addFilter(_Expected())
    return logger


def logged(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with librdkafka's own log lines routed through Python logging."""
    return {**config, "logger": client_logger()}
