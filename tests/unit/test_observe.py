"""Trace context on commands and fired deadlines, probes, metrics and JSON log lines."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from confluent_kafka import KafkaException
from prometheus_client.parser import text_string_to_metric_families

from processor._engine.records import Record
from processor._engine.rows import DeadLetter, ParkedMessage, WriteSet
from processor._observe.health import Probe, liveness, readiness
from processor._observe.logs import ContextFilter, configure_logging, set_replica
from processor._observe.metrics import Metrics
from processor._observe.sampler import Sampler
from processor._observe.server import ObserveServer
from processor._ports.cluster import TP, DatabaseSample
from processor._wire import FiredRecord, child_traceparent, parse_traceparent
from tests.support.procs import REPO
from tests.unit.test_plan import SAGA, Log, Noted, Opened, _active, _loaded, _plan, _planner

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def _traced(record: Record, traceparent: str, tracestate: str | None = None) -> Record:
    extra = [("traceparent", traceparent.encode())]
    if tracestate is not None:
        extra.append(("tracestate", tracestate.encode()))
    return dataclasses.replace(record, headers=(*record.headers, *extra))


def test_a_command_continues_its_events_trace_under_a_new_span() -> None:
    log = Log()
    event = _traced(log.event(Noted(order_id="o1", note="a")), PARENT, "vendor=x")
    ws = _plan(_planner(), [event], _loaded(_active()))
    [command] = ws.outbox
    parsed = parse_traceparent(command.headers["traceparent"])
    assert parsed is not None
    trace_id, span_id, flags = parsed
    assert trace_id == TRACE
    assert span_id != "00f067aa0ba902b7"
    assert flags == "01"
    assert command.headers["tracestate"] == "vendor=x"
    # Planned again (a failed commit), the command carries the very same headers.
    again = _plan(_planner(), [event], _loaded(_active()))
    assert again.outbox[0].headers["traceparent"] == command.headers["traceparent"]


def test_an_event_without_or_with_a_broken_trace_context_gives_commands_none() -> None:
    log = Log()
    plain = log.event(Noted(order_id="o1", note="a"))
    broken = _traced(log.event(Noted(order_id="o1", note="b")), "00-zz-00-01")
    ws = _plan(_planner(), [plain, broken], _loaded(_active()))
    assert [("traceparent" in o.headers) for o in ws.outbox] == [False, False]


def test_a_deadline_keeps_its_events_trace_for_the_fired_record() -> None:
    log = Log()
    ws = _plan(_planner(), [_traced(log.event(Opened(order_id="o1")), PARENT)], _loaded())
    [deadline] = ws.deadline_inserts
    assert deadline.traceparent == PARENT
    fired = FiredRecord(SAGA, "o1", "d1", "remind", 7, datetime.now(UTC))
    headers = fired.headers(deadline.traceparent, deadline.tracestate)
    parsed = parse_traceparent(headers["traceparent"])
    assert parsed is not None
    assert parsed[0] == TRACE
    assert parsed[1] != "00f067aa0ba902b7"
    assert "traceparent" not in fired.headers()


def test_child_traceparent_refuses_invalid_parents() -> None:
    assert child_traceparent(None, "x") is None
    assert child_traceparent(f"00-{'0' * 32}-00f067aa0ba902b7-01", "x") is None
    assert child_traceparent(f"ff-{TRACE}-00f067aa0ba902b7-01", "x") is None
    assert child_traceparent(PARENT, "a") != child_traceparent(PARENT, "b")


def test_liveness_needs_every_loop_and_a_recent_step() -> None:
    now = time.monotonic()
    assert liveness({"consumer": True, "relay": True}, now, 5).ok
    assert not liveness({"consumer": True, "relay": False}, now, 5).ok
    assert not liveness({"consumer": True}, now - 10, 5).ok
    assert not liveness({}, now, 5).ok


def test_readiness_needs_a_recent_sample_the_schema_and_claimed_partitions() -> None:
    worker = {"detached": False, "unsynced": False, "owned": 2, "unclaimed": 0}

    def ready(**kw: object) -> Probe:
        args: dict[str, object] = {
            "sample_age": 1.0,
            "sample_error": None,
            "schema_version": 5,
            "expected_version": 5,
            "worker": worker,
            "stale_after": 10.0,
        }
        args.update(kw)
        return readiness(**args)  # type: ignore[arg-type]

    assert ready().ok
    assert not ready(sample_age=None).ok
    assert (
        "database not reachable: OperationalError"
        in ready(sample_age=20.0, sample_error="OperationalError").detail["problems"][0]
    )
    # The last sample failed: not ready at once, though the last good one is still fresh.
    failed = ready(sample_age=1.0, sample_error="OperationalError: connection refused")
    assert not failed.ok
    assert failed.detail["problems"] == [
        "database not reachable: OperationalError: connection refused"
    ]
    assert not ready(schema_version=4).ok
    assert ready(schema_version=6).ok  # a rollback: migrations only add
    assert not ready(worker={**worker, "detached": True}).ok
    assert not ready(worker={**worker, "unclaimed": 1}).ok
    assert ready(worker={**worker, "owned": 0}).ok  # more replicas than partitions


def _scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_follow_batches_samples_and_sweeps() -> None:
    m = Metrics(replica="replica-7")
    stats = type(
        "S",
        (),
        {
            "batches": 3,
            "resyncs": 1,
            "doubts_unresolved": 2,
            "outcomes": {(SAGA, "COMPENSATION_FAILED"): 2},
            "escalations": {(SAGA, "undo"): 1},
            "foreign": {},
        },
    )()
    m.sources.worker_stats = stats
    m.sources.rebalances = {"assigned": 2}
    m.sources.up = lambda: True
    m.batch(4, {"in": 4}, 0.01, 0.02)
    record = Record("in", 0, 9, b"k", b"v", ())
    ws = WriteSet(
        dead_letters=[DeadLetter(record, "undecodable", "x")],
        parked=[
            ParkedMessage(SAGA, "o1", record, "handler: ValueError"),
            ParkedMessage(SAGA, "o1", record, "behind a parked saga"),
            ParkedMessage(
                SAGA, "o2", record, "'orders.X' schema-version 3 is newer than this code knows"
            ),
        ],
    )
    m.committed(ws)
    m.fired([0.2])
    sample = DatabaseSample(
        outbox_depth=3,
        outbox_oldest_age=1.5,
        instances={(SAGA, "active"): 2, (SAGA, "parked"): 1},
        machine_states={(SAGA, "WAITING"): (2, 30.0)},
        state_ages={(SAGA, "WAITING"): ((1, 2, 2, 2, 2, 2, 2, 2), 40.0)},
        stored_offsets={("in", 0): 10, ("in", 1): None},
        schema_version=5,
    )
    m.sampled(sample, {("in", 0): 15, ("in", 1): 4, ("other", 0): 9})
    got = _scrape(m)
    assert got[("saga_records_consumed_total", (("topic", "in"),))] == 4
    assert got[("saga_batches_total", ())] == 3
    [(labels, one)] = [(k[1], v) for k, v in got.items() if k[0] == "saga_build_info"]
    assert (dict(labels)["replica"], one) == ("replica-7", 1.0)
    assert got[("process_resident_memory_bytes", ())] > 0
    assert got[("saga_resyncs_total", ())] == 1
    assert got[("saga_batches_outcome_unknown_total", ())] == 2
    ended = (("outcome", "COMPENSATION_FAILED"), ("saga_type", SAGA))
    assert got[("saga_ended_total", ended)] == 2
    assert got[("saga_escalations_total", (("kind", "undo"), ("saga_type", SAGA)))] == 1
    assert got[("saga_rebalances_total", (("kind", "assigned"),))] == 2
    assert got[("saga_batch_size_records_sum", ())] == 4
    assert got[("saga_dead_letters_total", (("reason", "undecodable"),))] == 1
    assert got[("saga_handler_errors_total", (("saga_type", SAGA),))] == 1
    assert got[("saga_deadline_fire_lag_seconds_count", ())] == 1
    assert got[("saga_outbox_depth_rows", ())] == 3
    waiting = (("saga_type", SAGA), ("state", "WAITING"))
    assert got[("saga_state_age_seconds_bucket", (("le", "60"), *waiting))] == 1
    assert got[("saga_state_age_seconds_bucket", (("le", "+Inf"), *waiting))] == 2
    assert got[("saga_state_age_seconds_gsum", waiting)] == 40.0
    assert got[("saga_consumer_lag_records", (("partition", "0"), ("topic", "in")))] == 5
    assert got[("saga_consumer_lag_records", (("partition", "1"), ("topic", "in")))] == 4
    assert ("saga_consumer_lag_records", (("partition", "0"), ("topic", "other"))) not in got
    assert got[("saga_parked_sagas", (("saga_type", SAGA),))] == 1
    assert (
        got[("saga_machine_state_oldest_age_seconds", (("saga_type", SAGA), ("state", "WAITING")))]
        == 30
    )
    assert got[("saga_up", ())] == 1

    # The broker did not answer: the lag stays as last seen; the database's sample is new.
    m.sampled(dataclasses.replace(sample, outbox_depth=7), None)
    got = _scrape(m)
    assert got[("saga_consumer_lag_records", (("partition", "0"), ("topic", "in")))] == 5
    assert got[("saga_outbox_depth_rows", ())] == 7


def test_the_sampler_keeps_the_last_lag_while_the_broker_does_not_answer() -> None:
    m = Metrics()
    marks: list[dict[TP, int] | Exception] = [{("in", 0): 12}, KafkaException("down"), {}]

    def watermarks(tps: Sequence[TP]) -> dict[TP, int]:
        assert list(tps) == [("in", 0)]
        answer = marks.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sample = DatabaseSample(stored_offsets={("in", 0): 2})
    sampler = Sampler(lambda: sample, m, 1.0, watermarks)
    lag = ("saga_consumer_lag_records", (("partition", "0"), ("topic", "in")))
    assert sampler.sample_once()
    assert _scrape(m)[lag] == 10
    assert sampler.sample_once()  # the database answered: a good sample, the lag as last seen
    assert _scrape(m)[lag] == 10
    assert sampler.sample_once()  # the broker answered: the partition is no longer ours
    assert lag not in _scrape(m)


def test_every_metric_of_the_contract_is_exported() -> None:
    from pathlib import Path

    contract = Path(__file__).parents[2] / "deploy" / "METRICS.md"
    names = {
        line.split("`")[1]
        for line in contract.read_text().splitlines()
        if line.startswith("| `saga_")
    }
    m = Metrics()
    m.sampled(
        DatabaseSample(
            instances={("t", "parked"): 1},
            machine_states={("t", "S"): (1, 1.0)},
            state_ages={("t", "S"): ((1,) * 8, 1.0)},
            stored_offsets={("in", 0): 0},
        ),
        {("in", 0): 1},
    )
    m.committed(WriteSet(dead_letters=[DeadLetter(Record("in", 0, 0, None, None, ()), "r", "")]))
    m.committed(WriteSet(parked=[ParkedMessage("t", "i", Record("in", 0, 0, None, None, ()), "x")]))
    m.batch(1, {"in": 1}, 0.0, 0.0)
    m.sources.relay = type("R", (), {"published": 0, "failed_rounds": {"broker": 1}})()
    m.sources.off_partition = {"in": 1}
    m.sources.stale_producers = {"in": 1}
    m.sources.functions = lambda: {"t": (1, 1, 1)}
    m.sources.schema_registry = lambda: {"consumer": 1}
    m.sources.worker_stats = type(
        "S",
        (),
        {
            "batches": 1,
            "resyncs": 0,
            "doubts_unresolved": 0,
            "outcomes": {("t", "COMPLETED"): 1},
            "escalations": {("t", "step"): 1},
            "foreign": {("in", "other-saga"): 1},
        },
    )()
    exported = {name for name, _ in _scrape(m)}
    bases = {n.removesuffix(s) for n in exported for s in ("_bucket", "_sum", "_count", "")}
    assert names - bases == set()


def test_the_endpoint_serves_metrics_and_probes_on_a_free_port() -> None:
    m = Metrics()
    state = {"healthy": True}
    server = ObserveServer(
        m.registry,
        lambda: Probe(state["healthy"], {"status": "x"}),
        lambda: Probe(False, {"problems": ["database not reachable"]}),
        host="127.0.0.1",
        port=0,
    )
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
            assert "saga_batches_total" in r.read().decode()
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
            assert r.status == 200
        state["healthy"] = False
        for path in ("/healthz", "/readyz"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"{base}{path}", timeout=5)
            assert e.value.code == 503
            e.value.close()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/nope", timeout=5)
        assert e.value.code == 404
        e.value.close()
    finally:
        server.close()


def test_json_log_lines_carry_level_logger_replica_and_ids(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("INFO", "json")
        set_replica("replica-1")
        logging.getLogger("processor.report").warning(
            "dead letter", extra={"saga_id": "o1", "partition": 3, "trace_id": TRACE}
        )
        line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert line["level"] == "WARNING"
        assert line["logger"] == "processor.report"
        assert line["message"] == "dead letter"
        assert line["replica"] == "replica-1"
        # ISO-8601 in UTC, so lines of replicas in other zones sort together.
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", line["time"])
        assert (line["saga_id"], line["partition"], line["trace_id"]) == ("o1", 3, TRACE)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        set_replica("-")
    assert isinstance(ContextFilter(), logging.Filter)


def test_a_taken_metrics_port_stops_the_start_with_exit_2_naming_the_setting() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
        env.update(
            SAGA_SAGAS='["sagas"]',
            # Never reached: the port is checked before anything connects.
            SAGA_DATABASE__URL="postgresql://nobody@127.0.0.1:1/nothing",
            SAGA_METRICS__HOST="127.0.0.1",
            SAGA_METRICS__PORT=str(port),
        )
        done = subprocess.run(
            [sys.executable, "-m", "processor", "run"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "set SAGA_METRICS__PORT to a free port" in done.stderr
    assert "Traceback" not in done.stderr


def test_text_log_lines_start_with_an_iso_utc_time(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("INFO", "text")
        logging.getLogger("processor.report").warning("relay round failed")
        line = capsys.readouterr().err.strip().splitlines()[-1]
        stamp, level, logger = line.split(" ")[:3]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", stamp)
        assert (level, logger) == ("WARNING", "processor.report")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_saga_function_runs_are_counted_as_resumed_or_replayed_for_the_metrics() -> None:
    from decimal import Decimal

    from processor._authoring.functions import function_spec
    from processor._runtime.functions import function_tallies
    from processor.testing import SagaFixture
    from sagas.trip_function import trip_function
    from schemas.trips import FlightReserved, HotelReserved, TripRequested

    f = SagaFixture(trip_function)
    read = function_tallies({"trip-function": f.bound})
    resumed, replayed, _ = read()["trip-function"]
    tid = "metrics-trip"
    f.when(
        TripRequested(
            trip_id=tid, traveller_id="a", flight="LH 1", hotel="H", amount=Decimal("1.00")
        )
    )
    f.when(FlightReserved(trip_id=tid))
    # Held in memory after the start: the reply resumes it.
    assert read()["trip-function"][:2] == (resumed + 1, replayed)
    # A replica that took the partition over holds nothing: the next reply replays.
    spec = function_spec(trip_function)
    assert spec is not None
    spec.suspended.drop(tid)
    f.when(HotelReserved(trip_id=tid))
    assert read()["trip-function"][:2] == (resumed + 1, replayed + 1)
