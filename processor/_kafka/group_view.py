"""The consumer group as its coordinator sees it, asked from a process of its own.

librdkafka's admin client can abort the whole process when a request to a group coordinator
(DescribeConsumerGroups) fails as its connection drops: ``rd_kafka_enq_once_del_source_return:
Assertion `eonce->refcnt > 0' failed`` (librdkafka issue 4605, in 2.16 still). The membership
watch (:class:`processor._kafka.client.SagaConsumer`) asks exactly while brokers come and go, and
after a broker restart every replica of a group asked at once and every one of them aborted. So
the question is asked by a short-lived child process: an abort ends the child, and the watch
reads it as "not described", as it reads a broker that does not answer.

The child gets the client's settings on its standard input (never on its command line, where
other users of the machine could read a password) and answers in JSON on its standard output.
Settings that are not strings, numbers or booleans (callbacks) stay behind.

``python -m processor._kafka.group_view`` is the child.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GroupView", "describe_group"]

log = logging.getLogger(__name__)

# The child's own start (an interpreter and confluent-kafka), past the request's timeout.
_START = 10.0


@dataclass(frozen=True)
class GroupView:
    """A consumer group: its state (``stable``, ``empty``, ...) and its members' ids."""

    state: str
    members: tuple[str, ...]


def describe_group(
    config: Mapping[str, Any],
    group: str,
    timeout: float,
    *,
    command: Sequence[str] = (sys.executable, "-m", __name__),
) -> GroupView | None:
    """Asks the group's coordinator about ``group``, from a child process (``command``).

    Returns:
        The group, or None when it could not be described: the broker did not answer within
        ``timeout``, or the child ended otherwise (an abort inside librdkafka among them).
    """
    settings = {k: v for k, v in config.items() if isinstance(v, str | int | float | bool)}
    request = json.dumps({"config": settings, "group": group, "timeout": timeout})
    try:
        done = subprocess.run(
            list(command),
            input=request,
            capture_output=True,
            text=True,
            timeout=timeout + _START,
            check=False,
        )
    except subprocess.TimeoutExpired:
        log.debug("group %s not described: no answer within %.0f s", group, timeout + _START)
        return None
    if done.returncode < 0:
        log.warning(
            "group %s not described: the process asking ended on signal %d (librdkafka aborts "
            "so when a coordinator request meets a dropped connection); asking again later",
            group,
            -done.returncode,
        )
        return None
    if done.returncode != 0:
        log.debug("group %s not described: %s", group, done.stderr.strip()[-300:])
        return None
    answer = json.loads(done.stdout)
    return GroupView(str(answer["state"]), tuple(str(m) for m in answer["members"]))


def main() -> int:
    """The child: the request on standard input, the group on standard output (exit 1 if not)."""
    from confluent_kafka.admin import AdminClient

    request = json.load(sys.stdin)
    group, timeout = request["group"], float(request["timeout"])
    admin = AdminClient(request["config"])
    try:
        futures = admin.describe_consumer_groups([group], request_timeout=timeout)
        found = futures[group].result(timeout=timeout + 1)
    except Exception as e:  # the broker is away: the parent asks again later
        print(e, file=sys.stderr)
        return 1
    members = [m.member_id for m in found.members]
    print(json.dumps({"state": found.state.name.lower(), "members": members}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
