"""The Temporal peer's child process (see :mod:`benchmarks.peer_temporal`): worker and client.

Runs only in the ``bench`` virtualenv, where the Temporal SDK is installed:
``python -m benchmarks.peer_temporal_child SPEC_JSON`` prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
import uuid
from collections import Counter
from datetime import timedelta
from importlib.metadata import version
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from benchmarks.boxcpu import tree_seconds
from benchmarks.s10_saga import COMPENSATED, COMPLETED, credit_refused, half_rate, latency_summary

SDK = "temporalio"
MAX_CONCURRENT = 100
START_CONCURRENCY = 100
WARM_UP = 10
ACTIVITY_TIMEOUT = timedelta(seconds=30)
# Visibility (the server's index of workflows) has nothing to wait on: it is polled.
POLL = 0.1


@activity.defn(name="debit")
async def debit(transfer_id: str) -> None:
    """The source is debited: no work beyond the call."""


@activity.defn(name="credit")
async def credit(transfer_id: str) -> bool:
    return not credit_refused(transfer_id)


@activity.defn(name="reverse")
async def reverse(transfer_id: str) -> None:
    """The debit is given back: no work beyond the call."""


@workflow.defn(name="TransferSaga", sandboxed=False)
class TransferSaga:
    @workflow.run
    async def run(self, transfer_id: str) -> str:
        await workflow.execute_activity(debit, transfer_id, start_to_close_timeout=ACTIVITY_TIMEOUT)
        if await workflow.execute_activity(
            credit, transfer_id, start_to_close_timeout=ACTIVITY_TIMEOUT
        ):
            return COMPLETED
        await workflow.execute_activity(
            reverse, transfer_id, start_to_close_timeout=ACTIVITY_TIMEOUT
        )
        return COMPENSATED


class Peer:
    """The client, the box's CPU readings and the waits of both phases."""

    def __init__(self, client: Client, server_pid: int, deadline: float) -> None:
        self.client = client
        self.server_pid = server_pid
        self.deadline = deadline
        self.run_id = uuid.uuid4().hex[:8]

    def box(self) -> tuple[float, float]:
        """CPU seconds of this process (the SDK's core threads too) and of the server."""
        return time.process_time(), tree_seconds(self.server_pid) or 0.0

    def worker(self, queue: str) -> Worker:
        return Worker(
            self.client,
            task_queue=queue,
            workflows=[TransferSaga],
            activities=[debit, credit, reverse],
            workflow_runner=UnsandboxedWorkflowRunner(),
            max_concurrent_workflow_tasks=MAX_CONCURRENT,
            max_concurrent_activities=MAX_CONCURRENT,
        )

    async def start(self, queue: str, tid: str) -> None:
        await self.client.start_workflow(TransferSaga.run, tid, id=tid, task_queue=queue)

    async def wait_closed(self, queue: str, count: int) -> None:
        query = f"TaskQueue = '{queue}' AND ExecutionStatus != 'Running'"
        give_up = time.monotonic() + self.deadline
        while (seen := (await self.client.count_workflows(query)).count) < count:
            if time.monotonic() > give_up:
                raise RuntimeError(f"{queue}: {seen}/{count} closed within {self.deadline} s")
            await asyncio.sleep(POLL)

    async def ends(self, queue: str) -> dict[str, tuple[float, str]]:
        """Each workflow's close time (the server's clock, epoch seconds) and status."""
        out: dict[str, tuple[float, str]] = {}
        async for wf in self.client.list_workflows(f"TaskQueue = '{queue}'"):
            if wf.close_time is None:
                raise RuntimeError(f"{wf.id} has not closed")
            out[wf.id] = (wf.close_time.timestamp(), wf.status.name if wf.status else "?")
        return out

    def ids(self, label: str, count: int) -> list[str]:
        return [f"tr-{self.run_id}-{label}-{n:07d}" for n in range(count)]

    async def saturate(self, label: str, count: int) -> dict[str, Any]:
        queue = f"s10-{self.run_id}-{label}"
        gate = asyncio.Semaphore(START_CONCURRENCY)

        async def one(tid: str) -> None:
            async with gate:
                await self.start(queue, tid)

        async with self.worker(queue):
            t0, box0 = time.time(), self.box()
            await asyncio.gather(*(one(t) for t in self.ids(label, count)))
            await self.wait_closed(queue, count)
            box1 = self.box()
        ends = await self.ends(queue)
        seconds = max(t for t, _ in ends.values()) - t0
        return {
            "sagas": count,
            "seconds": seconds,
            "sagas_per_s": count / seconds,
            "cpu_s": {"worker": box1[0] - box0[0], "server": box1[1] - box0[1]},
            "outcomes": dict(Counter(s for _, s in ends.values())),
        }

    async def latency(self, rate: float, seconds: float) -> dict[str, Any]:
        queue = f"s10-{self.run_id}-lat"
        ids = self.ids("lat", max(1, math.ceil(rate * seconds)))
        sent: dict[str, float] = {}
        async with self.worker(queue):
            t0 = time.monotonic()
            starts: list[asyncio.Task[None]] = []
            for n, tid in enumerate(ids):
                # Paced by the clock: start n is due n / rate seconds after the first.
                await asyncio.sleep(max(0.0, t0 + n / rate - time.monotonic()))
                sent[tid] = time.time()
                starts.append(asyncio.create_task(self.start(queue, tid)))
            await asyncio.gather(*starts)
            await self.wait_closed(queue, len(ids))
        ends = await self.ends(queue)
        return {
            "rate": rate,
            "seconds": seconds,
            **latency_summary([ends[t][0] - s for t, s in sent.items()]),
        }


async def _main(spec: dict[str, Any]) -> dict[str, Any]:
    client = await Client.connect(spec["address"], namespace="default")
    peer = Peer(client, int(spec["server_pid"]), float(spec["deadline"]))
    await peer.saturate("warm", WARM_UP)
    sat = await peer.saturate("sat", int(spec["sagas"]))
    lat = await peer.latency(half_rate(sat["sagas_per_s"]), float(spec["seconds"]))
    return {
        "saturation": sat,
        "latency": lat,
        "setup": {
            "sdk": f"{SDK} {version(SDK)}",
            "workflow_sandbox": False,
            "max_concurrent_workflow_tasks": MAX_CONCURRENT,
            "max_concurrent_activities": MAX_CONCURRENT,
            "start_concurrency": START_CONCURRENCY,
            "activities": "async def, trivial bodies, start_to_close 30 s, default retries",
            "warm_up_workflows": WARM_UP,
        },
    }


if __name__ == "__main__":
    result = asyncio.run(_main(json.loads(sys.argv[1])))
    print(json.dumps(result), flush=True)
    # The SDK's core threads can abort the interpreter's teardown; the result is out (the
    # workers and the client were shut down above), so leave without it.
    os._exit(0)
