"""S10's Temporal peer: the transfer saga as a Temporal workflow of three activities.

Debit, credit, and on a refused credit the reversal, each an activity whose body is the shared
decision of :mod:`benchmarks.s10_saga` and nothing else; the workflow returns how it ended. The
server is the CLI's dev server (:mod:`benchmarks.temporal_server`), started for the measure and
stopped after it; the worker and the client run in a child process of the ``bench``
virtualenv (:mod:`benchmarks.peer_temporal_child`), which measures two phases:

- saturation: N workflows started at once (at most 100 start calls in flight), timed from the
  first start until the last one closed, by the server's close times; the box's CPU (the
  child, the SDK's core threads included, and the server's process) over the same window;
- latency: workflows started at half of that rate for a few seconds; each one's latency is its
  close time minus the moment its start was sent.

The workflow runs without the SDK's sandbox, whose checks on every workflow task cost CPU a
production worker would pay: the peer is measured at its cheapest. An untimed warm-up of a few
workflows goes first.
"""

from __future__ import annotations

from typing import Any

from benchmarks import temporal_server
from benchmarks.common import BENCH_PYTHON, bench_child, say

CHILD_DEADLINE = 900.0


def measure(sagas: int, seconds: float, deadline: float) -> dict[str, Any]:
    """The peer's result, or ``{"skipped": reason}`` when it cannot run here."""
    if not BENCH_PYTHON.exists():
        return {"skipped": f"no {BENCH_PYTHON} (`make bench` makes it with the `bench` extra)"}
    try:
        path = temporal_server.binary()
    except temporal_server.Unavailable as e:
        return {"skipped": str(e)}
    try:
        with temporal_server.dev_server(path) as server:
            say(f"  Temporal dev server at {server.address} (pid {server.pid}): {server.version}")
            got = bench_child(
                "benchmarks.peer_temporal_child",
                {
                    "address": server.address,
                    "server_pid": server.pid,
                    "sagas": sagas,
                    "seconds": seconds,
                    "deadline": deadline,
                },
                CHILD_DEADLINE,
            )
    except temporal_server.Unavailable as e:
        return {"skipped": str(e)}
    sat = got["saturation"]
    cpu = sat["cpu_s"]
    sat["box_us"] = sum(cpu.values()) / sat["sagas"] * 1e6
    got["setup"].update(
        {
            "server": f"temporal CLI {temporal_server.CLI_VERSION} built with `go install "
            f"{temporal_server.CLI_MODULE}@{temporal_server.CLI_VERSION}`: {server.version}",
            "server_command": "temporal server start-dev --headless --ip 127.0.0.1 "
            "--db-filename <temporary file> --log-level warn",
            "persistence": "SQLite file (the dev server's), in a temporary directory",
            "namespace": "default",
            "sagas": sagas,
            "box_cpu": "the child (worker + client) and the dev server's process tree",
        }
    )
    return got
