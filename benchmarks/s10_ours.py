"""S10, this engine's side: the transfer saga with its participant answering, in two phases.

The processor runs in this process as S1 runs it (production settings but for the scratch
names, batches of 500); the account service, a participant on the kit that only answers
(:mod:`benchmarks.s10_participant`), runs in a process of its own, as a service would. A saga is
five records (its start, two commands, two replies) and ends COMPLETED, or COMPENSATED when the
credit is refused (the reversal sent in the same transaction as the end).

- saturation: N TransferRequested events wait in the input topic; timed from the processor's
  partition assignment (the participant already has its own) until the last saga ended, by the
  sagas' ``ended_at``; the box's CPU (this process, the participant's, PostgreSQL's and the
  broker's) over the same window.
- latency: then, on the same processor and participant, TransferRequested events published at
  half of that rate for a few seconds; each saga's latency is its ``ended_at`` minus the moment
  its start event was handed to the producer.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined, unused-ignore]

from benchmarks import s1_backlog, s10_participant
from benchmarks.boxcpu import Meter, Usage, process_seconds
from benchmarks.common import Scratch, Services, kafka_config, say
from benchmarks.live import Child, Source, child_spec
from benchmarks.s10_saga import half_rate, latency_summary
from processor._bootstrap.processor import build_processor
from processor._postgres.schema.tables import Tables
from processor._runtime.processor import Processor
from sagas.transfer import TransferSaga
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC

PARTITIONS = s1_backlog.PARTITIONS
READY_DEADLINE = 60.0
# Neither the sagas' ends nor a partition's owner can be waited on: their rows are polled.
POLL = 0.02
# The count of ended sagas reads every ended row: polled this often in the timed window, its own
# cost stays out of the database's CPU per saga. The rate is not bound to the polls: it is
# taken from the sagas' recorded ends.
ENDS_POLL = 0.1


@dataclass(frozen=True)
class _Topics:
    events: str
    commands: str


def measure(
    found: Services, box: Scratch, meter: Meter, sagas: int, seconds: float, deadline: float
) -> dict[str, Any]:
    """This engine's saturation and latency phases; see the module."""
    topics = _Topics(
        box.topic(TRANSFER_EVENTS_TOPIC, PARTITIONS), box.topic(ACCOUNT_COMMANDS_TOPIC, PARTITIONS)
    )
    box.topic("saga-dead-letters", 1)
    s1_backlog.preload(found.kafka, topics.events, sagas, box.run_id)
    tables = box.schema("engine")
    participant_schema = f"bench_s10_accounts_{box.run_id}"
    box.schemas.append(participant_schema)  # dropped with the run's others
    box.settle()
    accounts = Child(
        "s10-participant",
        [
            "-m",
            "benchmarks.s10_participant",
            child_spec(
                kafka=found.kafka,
                database_url=found.database_url,
                schema=participant_schema,
                prefix=box.prefix,
            ),
        ],
        {},
    )
    try:
        _wait_assigned(found.kafka, box.prefix + s10_participant.GROUP, accounts)
        settings = s1_backlog.settings(found, tables, box.prefix)
        proc = build_processor(settings, (TransferSaga,))
        proc.start()
        failure: list[BaseException] = []

        def target() -> None:
            try:
                proc.run()
            except BaseException as e:  # reported after the phase it broke
                failure.append(e)

        thread = threading.Thread(target=target, name="bench-s10-processor", daemon=True)
        thread.start()
        try:
            watch = _Watch(found.database_url, tables, proc, failure, deadline)
            sat = _saturate(watch, meter, accounts, sagas)
            say(
                f"  engine: {sat['sagas_per_s']:,.0f} sagas/s, "
                f"{sat['box_us']:,.0f} us box CPU per saga; outcomes {sat['outcomes']}"
            )
            rate = half_rate(sat["sagas_per_s"])
            lat = _latency(found, watch, topics.events, box.run_id, sagas, rate, seconds)
            say(
                f"  engine at {rate:,.0f} sagas/s: p50 {lat['p50_ms']:.0f} ms, "
                f"p99 {lat['p99_ms']:.0f} ms"
            )
        finally:
            proc.stop()
            thread.join(30)
    finally:
        accounts.stop()
    box.settle(tables)
    return {
        "saturation": sat,
        "latency": lat,
        "setup": {
            "processor": "in process, as S1 runs it: s1_backlog.settings (batch size "
            f"{s1_backlog.BATCH_SIZE}, production defaults otherwise)",
            "participant": "benchmarks.s10_participant: a process of its own on the participant"
            f" kit, batch size {s10_participant.BATCH_SIZE}, handlers that only answer",
            "partitions": PARTITIONS,
            "sagas": sagas,
            "box_cpu": "this process (processor and harness), the participant's process, "
            "PostgreSQL's process tree, the Kafka broker",
        },
    }


class _Watch:
    """Reads how many sagas ended, and when the last one did, from the instance table."""

    def __init__(
        self,
        url: str,
        tables: Tables,
        proc: Processor,
        failure: list[BaseException],
        deadline: float,
    ) -> None:
        self.url = url
        self.tables = tables
        self.proc = proc
        self.failure = failure
        self.deadline = deadline

    def until(self, what: str, done: Callable[[], bool], every: float = POLL) -> None:
        """Polls ``done()`` until true; raises past the deadline or when the processor failed."""
        give_up = time.monotonic() + self.deadline
        while not done():
            if self.failure:
                raise RuntimeError("processor failed") from self.failure[0]
            if time.monotonic() > give_up:
                raise RuntimeError(f"engine: {what} not within {self.deadline:.0f} s")
            time.sleep(every)

    def ended(self, conn: psycopg.Connection[Any]) -> tuple[int, float]:
        row = conn.execute(
            self.tables.render(
                "SELECT count(*), coalesce(extract(epoch FROM max(ended_at)), 0)"
                " FROM {instance} WHERE status = 'ended'"
            )
        ).fetchone()
        assert row is not None
        return int(row[0]), float(row[1])

    def ends(self, conn: psycopg.Connection[Any], prefix: str) -> dict[str, tuple[float, str]]:
        rows = conn.execute(
            self.tables.render(
                "SELECT saga_id, extract(epoch FROM ended_at), coalesce(machine_state, status)"
                " FROM {instance} WHERE saga_id LIKE %s"
            ),
            (prefix + "%",),
        ).fetchall()
        return {str(r[0]): (float(r[1] or 0), str(r[2])) for r in rows}


def _saturate(watch: _Watch, meter: Meter, accounts: Child, sagas: int) -> dict[str, Any]:
    worker = watch.proc.worker
    assert worker is not None
    watch.until("partition assignment", lambda: bool(worker.owned))
    t0, box0, part0 = time.time(), meter.read(), _cpu(accounts)
    watched = time.thread_time()
    with psycopg.connect(watch.url, autocommit=True) as conn:
        last = [(0, 0.0)]

        def all_ended() -> bool:
            last[0] = watch.ended(conn)
            return last[0][0] >= sagas

        watch.until(f"{sagas} sagas ended", all_ended, ENDS_POLL)
        box1, part1 = meter.read(), _cpu(accounts)
    # The watcher runs in the processor's process: its own polling is not the processor's CPU.
    watcher = time.thread_time() - watched
    with psycopg.connect(watch.url, autocommit=True) as conn:
        outcomes = Counter(s for _, s in watch.ends(conn, "").values())
    used: Usage = box1.minus(box0).without(watcher)
    seconds = last[0][1] - t0
    cpu = {
        "processor": used.processor,
        "participant": part1 - part0,
        "postgres": used.postgres,
        "kafka": used.kafka,
    }
    return {
        "sagas": sagas,
        "seconds": seconds,
        "sagas_per_s": sagas / seconds,
        "cpu_s": cpu,
        "box_us": sum(v for v in cpu.values() if v is not None) / sagas * 1e6,
        "outcomes": dict(outcomes),
    }


def _latency(
    found: Services,
    watch: _Watch,
    topic: str,
    run_id: str,
    before: int,
    rate: float,
    seconds: float,
) -> dict[str, Any]:
    source = Source(found.kafka, topic, rate, f"{run_id}l")
    source.start(seconds)
    source.join()
    with psycopg.connect(watch.url, autocommit=True) as conn:
        watch.until(
            f"{source.count} paced sagas ended",
            lambda: watch.ended(conn)[0] >= before + source.count,
        )
        ends = watch.ends(conn, f"tr-{run_id}l-")
    sent = {key.decode(): at for key, at in source.sent.items()}
    return {
        "rate": rate,
        "seconds": seconds,
        **latency_summary([ends[t][0] - s for t, s in sent.items()]),
    }


def _cpu(child: Child) -> float:
    return process_seconds(child.popen.pid) or 0.0


def _wait_assigned(kafka: str, group: str, child: Child) -> None:
    """Until the participant's consumer group is stable with every command partition assigned.

    The participant keeps no owner in its tables (its positions appear on its first commit), so
    the broker's view of its group is what says it is ready.
    """
    admin = AdminClient(kafka_config(kafka))
    give_up = time.monotonic() + READY_DEADLINE
    while time.monotonic() < give_up:
        if child.popen.poll() is not None:
            raise RuntimeError(f"the participant exited; see {child.log_path}")
        future = admin.describe_consumer_groups([group], request_timeout=10)[group]
        try:
            described = future.result()
        except KafkaException:
            described = None  # not known to the coordinator yet
        if described is not None and described.state == ConsumerGroupState.STABLE:
            assigned = sum(len(m.assignment.topic_partitions) for m in described.members)
            if assigned >= PARTITIONS:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the participant's group was not assigned in time; see {child.log_path}")
