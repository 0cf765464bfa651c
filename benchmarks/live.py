"""Live-load tools for S2 and S5: engine replicas as processes, a paced event source, a reader.

Replicas run as users run them (``python -m processor run``, settings as ``SAGA_*`` variables),
each in its own process so the load generator and the reader here do not share its GIL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks.common import REPO, RESULTS_DIR, kafka_config
from benchmarks.raw_limits import produce
from processor._authoring.messages import (
    HEADER_CORRELATION_ID,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SCHEMA_VERSION,
    registry,
)
from processor.settings import ProcessorSettings
from schemas.transfers import TransferRequested


def settings_env(settings: ProcessorSettings) -> dict[str, str]:
    """The SAGA_* variables that reproduce `settings` in a child process."""
    data = settings.model_dump(mode="json", by_alias=True)
    data["database"]["url"] = settings.database.url.get_secret_value()
    return {
        f"SAGA_{key.upper()}": value if isinstance(value, str) else json.dumps(value)
        for key, value in data.items()
        if value is not None
    }


class Child:
    """A benchmark child process, its output in a log file under `.local/bench/logs`."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        logs = RESULTS_DIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path: Path = logs / f"{name}-{uuid.uuid4().hex[:6]}.log"
        self._log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            [sys.executable, *argv],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        """SIGKILL: the crash S5 measures recovery from."""
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)

    def stop(self, timeout: float = 20) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._log.close()


def engine_replica(name: str, settings: ProcessorSettings) -> Child:
    return Child(name, ["-m", "processor", "run"], settings_env(settings))


class Source:
    """Produces TransferRequested events at a steady rate on a thread; remembers when each went."""

    def __init__(self, kafka: str, topic: str, rate: float, run_id: str) -> None:
        self.topic = topic
        self.rate = rate
        self.run_id = run_id
        self.sent: dict[bytes, float] = {}
        self.count = 0
        self._stop = threading.Event()
        self._producer = Producer(
            {**kafka_config(kafka), "linger.ms": 1, "enable.idempotence": True}
        )
        self._mtype = registry.of(TransferRequested)
        self._thread: threading.Thread | None = None

    def start(self, seconds: float | None = None) -> None:
        self._thread = threading.Thread(target=self._run, args=(seconds,), daemon=True)
        self._thread.start()

    def _one(self, n: int) -> None:
        tid = f"tr-{self.run_id}-{n:08d}"
        event = TransferRequested(
            transfer_id=tid,
            source_account_id=f"acc-{n % 1000}",
            target_account_id=f"acc-{(n + 1) % 1000}",
            amount=Decimal("10.00"),
        )
        headers = [
            (HEADER_MESSAGE_ID, str(uuid.uuid4()).encode()),
            (HEADER_MESSAGE_TYPE, self._mtype.name.encode()),
            (HEADER_SCHEMA_VERSION, str(self._mtype.version).encode()),
            (HEADER_CORRELATION_ID, tid.encode()),
            (HEADER_OCCURRED_AT, datetime.now(UTC).isoformat().encode()),
        ]
        key = tid.encode()
        self.sent[key] = time.time()
        produce(
            self._producer,
            self.topic,
            key=key,
            value=event.model_dump_json().encode(),
            headers=headers,
        )

    def _run(self, seconds: float | None) -> None:
        t0 = time.perf_counter()
        end = t0 + seconds if seconds is not None else float("inf")
        while not self._stop.is_set() and time.perf_counter() < end:
            due = int((time.perf_counter() - t0) * self.rate)
            while self.count < due:
                self._one(self.count)
                self.count += 1
            self._producer.poll(0)
            time.sleep(0.002)
        self._producer.flush(30)

    def stop(self) -> None:
        self._stop.set()
        self.join()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(60)


class Reader:
    """Reads a command topic from its current end; latency = receipt minus the event's send."""

    def __init__(self, kafka: str, topic: str, source: Source) -> None:
        self.source = source
        self.latencies: list[float] = []
        self.seen: set[bytes] = set()
        self.records = 0
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                **kafka_config(kafka),
                "group.id": f"bench-reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
            }
        )
        meta = self._consumer.list_topics(topic, timeout=10).topics[topic]
        parts = []
        for p in meta.partitions:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            parts.append(TopicPartition(topic, p, high))
        self._consumer.assign(parts)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for msg in self._consumer.consume(num_messages=500, timeout=0.05):
                    if msg.error() is not None:
                        continue
                    now = time.time()
                    self.records += 1
                    key = msg.key()
                    if not isinstance(key, bytes):
                        continue
                    sent = self.source.sent.get(key)
                    if sent is not None and key not in self.seen:
                        self.seen.add(key)
                        self.latencies.append(now - sent)
        finally:
            self._consumer.close()

    def wait_for(self, count: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if len(self.seen) >= count:
                return True
            time.sleep(0.05)
        return len(self.seen) >= count

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def child_spec(**spec: Any) -> str:
    return json.dumps(spec)
