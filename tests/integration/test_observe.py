"""The metrics endpoint and the probes of a running processor, against Kafka and PostgreSQL."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from decimal import Decimal
from urllib.parse import urlsplit, urlunsplit

import pytest
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from processor._runtime.hooks import Hooks
from processor._wire import parse_traceparent
from sagas.transfer import TransferSaga
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC, TransferRequested
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    running,
    settings_for,
    wait_until,
)
from tests.support.proxy import Proxy

pytestmark = pytest.mark.integration

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def env(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Iterator[dict[str, str]]:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    topics = [
        prefix + t for t in (TRANSFER_EVENTS_TOPIC, ACCOUNT_COMMANDS_TOPIC, "saga-dead-letters")
    ]
    create_topics(kafka_bootstrap, topics, partitions=2)
    yield {"kafka": kafka_bootstrap, "db": database_url, "schema": pg_schema, "prefix": prefix}
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        future.result()


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode()


def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = _get(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _total(m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return sum(v for (n, _), v in m.items() if n == name)


def _requested(tid: str) -> TransferRequested:
    return TransferRequested(
        transfer_id=tid, source_account_id="A", target_account_id="B", amount=Decimal("10.00")
    )


def test_metrics_move_with_a_load_and_commands_continue_the_trace(env: dict[str, str]) -> None:
    settings = settings_for(
        env["kafka"],
        env["db"],
        env["schema"],
        env["prefix"],
        settings={"transfer.payment-timeout": 2},
        consumer={"batch_size": 5},
    )
    events = env["prefix"] + TRANSFER_EVENTS_TOPIC
    commands = Reader(env["kafka"], [env["prefix"] + ACCOUNT_COMMANDS_TOPIC])
    pub = Publisher(env["kafka"])
    traced = f"traced-{uuid.uuid4().hex[:6]}"
    pub.event(events, traced, _requested(traced), traceparent=f"00-{TRACE}-00f067aa0ba902b7-01")
    for i in range(400):
        pub.event(events, f"load-{i}", _requested(f"load-{i}"))
    pub.raw(events, b"bad", b"not json", [("message-type", b"no.such.Type")])
    pub.flush()
    # Until the test has seen the lag rise, each batch waits up to 50 ms before its commit: a
    # fast machine would otherwise drain the load between two samples of the gauge.
    seen_lag = threading.Event()
    hooks = Hooks()

    def slow_until_seen() -> None:
        seen_lag.wait(0.05)

    hooks.on("before-commit", slow_until_seen)
    try:
        with running(settings, [TransferSaga], hooks=hooks) as proc:
            port = proc.metrics_port
            assert port is not None
            wait_until(lambda: _total(_metrics(port), "saga_consumer_lag_records") > 0, what="lag")
            seen_lag.set()
            wait_until(
                lambda: (
                    _total(m := _metrics(port), "saga_records_consumed_total") >= 402
                    and _total(m, "saga_consumer_lag_records") == 0
                    and ("saga_consumer_lag_records" in {n for n, _ in m})
                ),
                what="lag drained",
            )
            wait_until(
                lambda: _total(_metrics(port), "saga_deadline_fire_lag_seconds_count") > 0,
                what="a fired deadline in the fire-lag histogram",
            )
            wait_until(
                lambda: (
                    _metrics(port).get(("saga_outbox_depth_rows", ()), -1) == 0
                    and _total(_metrics(port), "saga_relay_published_total") > 400
                ),
                what="outbox drained",
            )
            # Nobody confirms a debit: every transfer times out, counted by how it ended.
            timed_out = (("outcome", "TIMED_OUT"), ("saga_type", "transfer-saga"))
            wait_until(
                lambda: _metrics(port).get(("saga_ended_total", timed_out), 0) == 401,
                what="every transfer counted as timed out",
            )
            m = _metrics(port)
            assert _total(m, "saga_dead_letters_total") == 1
            assert m[("saga_dead_letters_total", (("reason", "unknown-type"),))] == 1
            assert _total(m, "saga_batches_total") > 0
            assert m[("saga_up", ())] == 1
            assert _total(m, "saga_build_info") == 1
            assert _total(m, "process_resident_memory_bytes") > 0
            assert _get(port, "/healthz")[0] == 200
            assert _get(port, "/readyz")[0] == 200
            commands.wait_for(
                lambda _: any(
                    commands.headers(c).get("saga-id") == traced for c in commands.records
                ),
                what="the traced saga's command",
            )
        [command] = [c for c in commands.records if commands.headers(c).get("saga-id") == traced][
            :1
        ]
        parsed = parse_traceparent(commands.headers(command).get("traceparent"))
        assert parsed is not None
        assert parsed[0] == TRACE
        assert parsed[1] != "00f067aa0ba902b7"
    finally:
        commands.close()


def test_readyz_follows_the_database_and_healthz_a_dead_loop(env: dict[str, str]) -> None:
    url = urlsplit(env["db"])
    assert url.hostname is not None
    assert url.port is not None
    proxy = Proxy((url.hostname, url.port))
    netloc = f"{url.username}:{url.password}@127.0.0.1:{proxy.port}"
    query = "sslmode=disable" if not url.query else f"{url.query}&sslmode=disable"
    proxied = urlunsplit((url.scheme, netloc, url.path, query, ""))
    settings = settings_for(
        env["kafka"],
        proxied,
        env["schema"],
        env["prefix"],
        # Longer than the consumer's wait on a silent database, as the defaults are (60 s and
        # 20 s): a step that started a store call just before the outage may wait that long,
        # and /healthz must not call the replica dead for it.
        metrics={"stale_after": "7s"},
        consumer={"unavailable_timeout": "5s"},
    )
    hooks = Hooks()
    kill = {"relay": False}

    def relay_round() -> None:
        if kill["relay"]:
            raise RuntimeError("fault: relay killed")

    hooks.on("relay-round", relay_round)
    seen_unhealthy: list[str] = []

    def before_close() -> None:
        # The endpoint stays up until this returns: look at /healthz in that window.
        port = proc.metrics_port
        assert port is not None
        status, body = _get(port, "/healthz")
        seen_unhealthy.append(f"{status} {body}")

    hooks.on("before-endpoint-close", before_close)
    try:
        proc_ctx = running(settings, [TransferSaga], hooks=hooks)
        with pytest.raises(AssertionError, match="relay killed"), proc_ctx as proc:  # noqa: PT012
            port = proc.metrics_port
            assert port is not None
            wait_until(lambda: _get(port, "/readyz")[0] == 200, what="ready")
            assert _get(port, "/healthz")[0] == 200
            proxy.black_hole()
            wait_until(lambda: _get(port, "/readyz")[0] == 503, what="unready", timeout=30)
            assert _get(port, "/healthz")[0] == 200  # a database outage is not a restart
            proxy.heal()
            wait_until(lambda: _get(port, "/readyz")[0] == 200, what="ready again", timeout=60)
            kill["relay"] = True
            wait_until(lambda: bool(seen_unhealthy), what="the loop's death")
        status, body = seen_unhealthy[0].split(" ", 1)
        assert status == "503"
        assert json.loads(body)["loops"]["relay"] is False
    finally:
        proxy.close()
