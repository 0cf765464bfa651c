"""The trip saga written as one function, under load on the real stack, with a replica killed.

Three replicas run ``sagas.trip_function`` against the demo's trip participants. While the
participants are held (SIGSTOP), so that sagas stand suspended mid-function, one replica is
SIGKILLed: the sagas it held are replayed from their journals by the replicas that take its
partitions over, and a fourth replica joins (another rebalance) as more trips arrive. Every
trip must end as its plan says, every command an await issued must be on the wire under one
message id per attempt (a relay's re-send carries the same id and the same bytes), every fired
deadline is applied once, and no saga is replayed into a different command (none parks).
"""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from demo.participants import app as participants_app
from processor._bootstrap.participant import migrate
from processor.ops import Adapters
from processor.settings import ProcessorSettings
from schemas.orders import ESCALATIONS_TOPIC
from schemas.trips import TRIP_COMMANDS_TOPIC, TRIP_EVENTS_TOPIC, TripRequested
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    query,
    settings_for,
    wait_until,
)
from tests.support.participants import ParticipantProcess
from tests.support.procs import ProcessorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SAGA = "sagas.trip_function:trip_function"
FIRST, SECOND = 60, 30
TIMEOUT = 180.0


def _trip(run: str, i: int) -> TripRequested:
    return TripRequested(
        trip_id=f"{run}-{i}",
        traveller_id="broke-ann" if i % 5 == 3 else f"traveller-{i % 4}",
        flight="FULL 404" if i % 7 == 5 else f"LH {i}",
        hotel="Adlon",
        amount=Decimal("480.00"),
    )


def _expected(trip: TripRequested) -> str:
    if trip.flight.startswith("FULL"):
        return "FAILED"
    return "COMPENSATED" if trip.traveller_id.startswith("broke") else "COMPLETED"


@pytest.fixture
def svc_schema(database_url: str, pg_schema: str) -> Iterator[str]:
    name = f"{pg_schema}_svc"
    settings = ProcessorSettings(database={"url": database_url}, participant={"schema_name": name})
    migrate(settings, participants_app())
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_trip_functions_end_once_each_through_a_kill_and_two_rebalances(
    kafka_bootstrap: str, database_url: str, pg_schema: str, svc_schema: str, tmp_path: Path
) -> None:
    kafka, db, schema = kafka_bootstrap, database_url, pg_schema
    prefix = f"tf{uuid.uuid4().hex[:8]}."
    create_topics(
        kafka,
        [prefix + t for t in (TRIP_EVENTS_TOPIC, TRIP_COMMANDS_TOPIC, ESCALATIONS_TOPIC)]
        + [prefix + "saga-dead-letters"],
        partitions=6,
    )
    settings = settings_for(kafka, db, schema, prefix, sagas=[SAGA], consumer={"batch_size": 20})
    # Migrated up front, as operators do, so the test reads the tables before a replica is up.
    Adapters(settings).ensure_schema()
    procs: list[ProcessorProcess] = []
    commands = Reader(kafka, [prefix + TRIP_COMMANDS_TOPIC])
    dead = Reader(kafka, [prefix + "saga-dead-letters"])
    publisher = Publisher(kafka)
    service = ParticipantProcess(
        kafka=kafka,
        database=db,
        schema=svc_schema,
        prefix=prefix,
        log_path=tmp_path / "participants.log",
        only=("airline", "hotels", "trip-billing"),
        group=f"{prefix}trips",
    )
    run = uuid.uuid4().hex[:6]
    trips = [_trip(run, i) for i in range(FIRST + SECOND)]
    try:
        for n in range(3):
            procs.append(ProcessorProcess(settings, tmp_path / f"replica-{n}.log"))
        for trip in trips[:FIRST]:
            publisher.event(prefix + TRIP_EVENTS_TOPIC, trip.trip_id, trip)
        publisher.flush()

        def ended() -> int:
            rows = query(db, schema, "SELECT count(*) FROM saga_instance WHERE status = 'ended'")
            return int(rows[0][0])

        wait_until(lambda: ended() >= 5, timeout=TIMEOUT, what="the first trips to end")
        # Held, the participants answer nothing more: sagas stand suspended between awaits.
        os.kill(service.pid, signal.SIGSTOP)
        midway = query(
            db,
            schema,
            "SELECT count(*) FROM saga_instance WHERE status = 'active' "
            "AND jsonb_array_length(state->'journal') >= 1",
        )[0][0]
        assert midway > 0, "no saga stood between two awaits when the replica was killed"
        doomed = procs[1]
        doomed.kill()
        assert doomed.popen.returncode == -signal.SIGKILL
        os.kill(service.pid, signal.SIGCONT)
        procs.append(ProcessorProcess(settings, tmp_path / "replica-3.log"))
        for trip in trips[FIRST:]:
            publisher.event(prefix + TRIP_EVENTS_TOPIC, trip.trip_id, trip)
        publisher.flush()
        wait_until(lambda: ended() == len(trips), timeout=TIMEOUT, what="every trip to end")
        rows = query(db, schema, "SELECT saga_id, status, machine_state, state FROM saga_instance")
        outcomes = {sid: (status, outcome) for sid, status, outcome, _ in rows}
        states = {sid: state for sid, _, _, state in rows}
        assert outcomes == {t.trip_id: ("ended", _expected(t)) for t in trips}
        expected_ids = _commands_in_journals(states)
        commands.wait_for(
            lambda _: _ids_by_trip(commands) == expected_ids,
            timeout=TIMEOUT,
            what="one message id per command attempt",
        )
        _same_bytes_under_each_id(commands)
        _in_journal_order(commands, states)
        applied = query(
            db,
            schema,
            "SELECT saga_id, message_id, count(*) FROM saga_history "
            "WHERE outcome = 'applied' GROUP BY 1, 2 HAVING count(*) > 1",
        )
        assert applied == [], "an input (a fired deadline, a reply) was applied twice"
        assert query(db, schema, "SELECT count(*) FROM saga_deadline") == [(0,)]
        dead.poll(timeout=1)
        assert dead.records == []
        for proc in procs:
            assert "Nondeterminism" not in proc.log()
    finally:
        if service.alive():
            os.kill(service.pid, signal.SIGCONT)  # a held process cannot handle SIGTERM
        service.stop()
        for proc in procs:
            proc.stop()
        commands.close()
        dead.close()


def _commands_in_journals(states: dict[str, Any]) -> dict[str, Counter[str]]:
    """Per trip, how many message ids each command type must have: one per attempt."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for sid, state in states.items():
        data = state if isinstance(state, dict) else json.loads(state)
        journal = data["journal"]
        for entry in journal:
            if entry.get("command"):
                out[sid][entry["command"]["type"]] += int(entry.get("attempts", 1))
        # A call that timed out and succeeded later is undone then, by one more command.
        for seq in _late_undos(data):
            out[sid][journal[seq]["undo"]["type"]] += 1
    return dict(out)


def _late_undos(data: dict[str, Any]) -> list[int]:
    found = re.findall(r"for await #(\d+): undo sent", " ".join(data.get("late", [])))
    return [int(seq) for seq in found]


def _ids_by_trip(reader: Reader) -> dict[str, Counter[str]]:
    ids: dict[str, dict[str, str]] = defaultdict(dict)
    for m in reader.records:
        h = reader.headers(m)
        ids[h["saga-id"]][h["message-id"]] = h["message-type"]
    return {sid: Counter(by_id.values()) for sid, by_id in ids.items()}


def _same_bytes_under_each_id(reader: Reader) -> None:
    seen: dict[str, bytes] = {}
    for m in reader.records:
        mid = reader.headers(m)["message-id"]
        assert seen.setdefault(mid, m.value()) == m.value(), f"{mid} sent with other bytes"


def _in_journal_order(reader: Reader, states: dict[str, Any]) -> None:
    """The first copy of each command is on the wire in the order the journal issued them."""
    wire: dict[str, list[str]] = defaultdict(list)
    firsts: set[str] = set()
    for m in reader.records:
        h = reader.headers(m)
        if h["message-id"] not in firsts:
            firsts.add(h["message-id"])
            if not wire[h["saga-id"]] or wire[h["saga-id"]][-1] != h["message-type"]:
                wire[h["saga-id"]].append(h["message-type"])
    for sid, state in states.items():
        data = state if isinstance(state, dict) else json.loads(state)
        if _late_undos(data):
            continue  # a late success's undo goes out whenever that success turns up
        issued = [e["command"]["type"] for e in data["journal"] if e.get("command")]
        assert wire[sid] == issued, (sid, wire[sid], issued)
