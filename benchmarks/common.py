"""What every scenario needs: the services, scratch topics and schemas, progress lines, results.

Services come from `devstack`: `SAGA_TEST_KAFKA_BOOTSTRAP` / `SAGA_TEST_DATABASE_URL` when both
are set, else containers or the local stack, and whatever this run started is stopped at the end
(a service that was already running is left alone).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined, unused-ignore]
from psycopg import sql

import devstack
from processor._postgres.connect import ensure_schema
from processor._postgres.schema.tables import Tables

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(os.environ.get("SAGA_LOCAL_DIR", REPO / ".local")) / "bench"
# The interpreter of the `bench` extra (`make bench` makes it): the peers run in it.
BENCH_PYTHON = Path(os.environ.get("SAGA_BENCH_PYTHON", REPO / ".venv-bench" / "bin" / "python"))

_STARTED = time.monotonic()


def say(message: str) -> None:
    """One progress line, stamped with the seconds since the benchmark started."""
    print(f"[bench {time.monotonic() - _STARTED:6.1f}s] {message}", flush=True)


def kafka_config(bootstrap: str) -> dict[str, Any]:
    """Client settings for every Kafka client the benchmarks make, the processor's included."""
    # librdkafka's notices (e.g. a warning per idempotent producer about an experimental
    # property) would drown the progress lines; errors still print.
    return {"bootstrap.servers": bootstrap, "log_level": "3"}


@dataclass(frozen=True)
class Services:
    """Where the services answer, as the scenarios read it."""

    kafka: str
    database_url: str
    # A Schema Registry's Confluent-compatible API, for the sides framed for one; None: skipped.
    schema_registry: str | None = None


@contextmanager
def services() -> Iterator[Services]:
    """The Kafka broker and PostgreSQL server to measure against, started here if needed."""
    with devstack.provide(say) as found, devstack.provide_registry(say) as registry:
        yield Services(found.kafka_bootstrap, found.database_url, registry.url)


@dataclass
class Scratch:
    """Topics and schemas that only this run uses; removed by `close()`."""

    services: Services
    label: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    topics: list[str] = field(default_factory=list)
    schemas: list[str] = field(default_factory=list)

    @property
    def prefix(self) -> str:
        """Topic prefix, as the processor's `topic_prefix` setting takes it."""
        return f"bench-{self.label}-{self.run_id}."

    def topic(self, name: str, partitions: int) -> str:
        full = self.prefix + name
        admin = AdminClient(kafka_config(self.services.kafka))
        futures = admin.create_topics([NewTopic(full, partitions, 1)], operation_timeout=30)
        for future in futures.values():
            future.result()
        self.topics.append(full)
        return full

    def schema(self, name: str) -> Tables:
        """A fresh schema with the processor's tables, migrated as the processor would."""
        tables = Tables(schema=f"bench_{self.label}_{name}_{self.run_id}")
        self.schemas.append(tables.schema)
        ensure_schema(self.services.database_url, tables)
        return tables

    def settle(self, tables: Tables | None = None) -> None:
        """Does now, untimed, the database's background work that a side's writes leave due.

        Vacuum and analyze of the side's tables (autovacuum would start them within its nap
        time, in the middle of the next side's run) and a checkpoint: the dirty buffers are
        written now, and the next timed checkpoint (whose final sync stalls commits for
        seconds on a small disk) is `checkpoint_timeout` away, past a run of a minute. Every
        side that writes to the database is followed by this, so each run starts on the same
        quiet server. Without ``tables``, before a first run: the checkpoint and the sync only.
        """
        with psycopg.connect(self.services.database_url, autocommit=True) as conn:
            if tables is not None:
                names = conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s", (tables.schema,)
                ).fetchall()
                for (name,) in names:
                    conn.execute(
                        sql.SQL("VACUUM (ANALYZE) {}.{}").format(
                            sql.Identifier(tables.schema), sql.Identifier(name)
                        )
                    )
            # A role without pg_checkpoint skips it: the vacuum alone still helps.
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
                conn.execute("CHECKPOINT")
        # And the kernel's dirty pages of services on this machine (Kafka's log segments above
        # all), which it would otherwise write back in the next run, in bursts that stall the
        # database's commits.
        os.sync()

    def close(self) -> None:
        if self.topics:
            admin = AdminClient(kafka_config(self.services.kafka))
            for future in admin.delete_topics(self.topics, operation_timeout=30).values():
                try:
                    future.result()
                except Exception as e:  # leftovers are harmless; say so and go on
                    say(f"could not delete a scratch topic: {e}")
        with psycopg.connect(self.services.database_url, autocommit=True) as conn:
            for schema in self.schemas:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )
        self.topics.clear()
        self.schemas.clear()


@contextmanager
def scratch(found: Services, label: str) -> Iterator[Scratch]:
    box = Scratch(found, label)
    try:
        yield box
    finally:
        box.close()


def bench_child(module: str, spec: Mapping[str, Any], deadline: float) -> dict[str, Any]:
    """Runs ``python -m module SPEC_JSON`` in the bench interpreter; returns the JSON line it
    printed last. A child that fails, or prints none, raises with the tail of its stderr."""
    done = subprocess.run(
        [str(BENCH_PYTHON), "-m", module, json.dumps(spec)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=deadline,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{module} failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def end_offsets(kafka: str, topic: str) -> dict[int, int]:
    """High watermark per partition: how many records each partition holds (none deleted)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**kafka_config(kafka), "group.id": f"bench-wm-{uuid.uuid4().hex}"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        out: dict[int, int] = {}
        for p in meta.partitions:
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            out[p] = high
        return out
    finally:
        consumer.close()


def alternating(
    sides: Mapping[str, Callable[..., dict[str, Any]]], rounds: int, *args: Any
) -> Iterator[tuple[int, dict[str, dict[str, Any]]]]:
    """Each round's results of two sides, each called as ``side(*args, n)``.

    The first side named goes first in odd rounds and second in even ones, so neither always
    meets the machine as the other left it (warm caches, dirty pages, a pending autovacuum).
    """
    first, second = sides
    for n in range(1, rounds + 1):
        order = (first, second) if n % 2 else (second, first)
        yield n, {name: sides[name](*args, n) for name in order}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


def machine() -> dict[str, Any]:
    """What the numbers were measured on, including how busy the machine was."""
    return {
        "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def write_report(stamp: str, results: dict[str, Any]) -> Path:
    """One JSON file per run, named by its start time, beside earlier runs' files."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{stamp}.json"
    doc = {"at": datetime.now(UTC).isoformat(), "scenarios": results, "machine_after": machine()}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """A plain aligned text table."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), line, *(fmt.format(*map(str, r)) for r in rows)])
