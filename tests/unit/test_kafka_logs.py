"""librdkafka's expected warnings are explained once; every other line still shows."""

from __future__ import annotations

import logging

import pytest

from processor._kafka.logs import LOGGER_NAME, _Expected, client_logger


def test_the_gapless_notice_is_explained_once_and_other_warnings_pass(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = client_logger()
    assert client_logger() is logger
    assert len(logger.filters) == 1
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    for _ in range(3):
        logger.warning(
            "CONFWARN [thrd:app]: Configuration property enable.gapless.guarantee is "
            "experimental: When set to `true`, any error that could result in a gap..."
        )
    other = "SASL authentication error: Authentication failed during authentication"
    logger.warning(other)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER_NAME]
    explained = [m for level, m in lines if m.startswith("expected client notice")]
    assert len(explained) <= 1  # once per process: an earlier test may have had it already
    assert all(level == "INFO" for level, m in lines if "gapless" in m)
    assert ("WARNING", other) in lines


@pytest.mark.parametrize(
    "line",
    [
        "FAIL [thrd:broker]: Connect to ipv4#127.0.0.1:1 failed: Connection refused",
        "ERROR [thrd:app]: 1/1 brokers are down",
    ],
)
def test_broker_not_up_noise_is_debug(caplog: pytest.LogCaptureFixture, line: str) -> None:
    logger = client_logger()
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    logger.error(line)
    assert [r for r in caplog.records if r.getMessage() == line] == []
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    logger.error(line)
    assert [r.levelname for r in caplog.records if r.getMessage() == line] == ["DEBUG"]


def test_the_gapless_notice_follows_the_level_like_any_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At WARNING (a command's default level) the notice lowered to INFO is not shown."""
    logger = client_logger()
    notice = "CONFWARN [thrd:app]: Configuration property enable.gapless.guarantee is experimental"
    caplog.set_level(logging.WARNING, logger=LOGGER_NAME)
    logger.warning(notice)
    assert [r for r in caplog.records if r.name == LOGGER_NAME] == []
    # At INFO a filter that has not explained it yet does (client_logger's may have already).
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    fresh = logging.getLogger(f"{LOGGER_NAME}.fresh")
    fresh.addFilter(_Expected())
    fresh.warning(notice)
    assert [(r.levelname, r.getMessage()[:23]) for r in caplog.records] == [
        ("INFO", "expected client notice:")
    ]
