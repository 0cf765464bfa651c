"""The membership watch asks about its group from a child process: an abort inside librdkafka
ends the child, never the processor."""

from __future__ import annotations

import logging
import sys

import pytest

from processor._kafka.group_view import GroupView, describe_group

ECHO = (
    "import json, sys\n"
    "r = json.load(sys.stdin)\n"
    "members = [r['group'], *sorted(r['config']), str(r['timeout'])]\n"
    "print(json.dumps({'state': 'stable', 'members': members}))\n"
)


def test_the_child_gets_the_request_on_its_input_without_callbacks() -> None:
    config = {"bootstrap.servers": "127.0.0.1:1", "sasl.password": "s", "logger": print}
    view = describe_group(config, "g1", 2.0, command=[sys.executable, "-c", ECHO])
    # The callback stays behind; the password travels on standard input, not the command line.
    assert view == GroupView("stable", ("g1", "bootstrap.servers", "sasl.password", "2.0"))


def test_a_child_that_aborts_is_a_group_not_described(caplog: pytest.LogCaptureFixture) -> None:
    aborts = [sys.executable, "-c", "import os; os.abort()"]
    with caplog.at_level(logging.WARNING):
        assert describe_group({}, "g1", 2.0, command=aborts) is None
    [line] = [r.getMessage() for r in caplog.records]
    assert "group g1 not described: the process asking ended on signal 6" in line


def test_an_unreachable_broker_is_a_group_not_described() -> None:
    # The real child, against a port nothing listens on.
    assert describe_group({"bootstrap.servers": "127.0.0.1:1"}, "g1", 0.5) is None
