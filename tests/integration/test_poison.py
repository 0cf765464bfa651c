"""Nothing one record, one deploy or one deadline does stops the line.

Records the store cannot hold are dead-lettered with their reason while good records on the same
partition and keys flow; stored state that no longer loads after a deploy parks those sagas
until a fixed deploy's retry; a failed deadline handler keeps its deadline for the retry; a
forged fired record for another saga's deadline is rejected and recorded.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from pydantic import AliasChoices, Field

from processor import (
    Message,
    SagaDeadlines,
    SagaState,
    message_type,
    saga,
    saga_deadline_handler,
    saga_event_handler,
)
from processor._bootstrap.adapters import tables_for
from processor._postgres.reads.operator import open_operator_queries
from processor._runtime.assembly import bind_sagas
from processor._wire import DEADLINE_FIRED, FiredRecord
from processor.ops._parked import RetryResult, retry_parked_saga
from processor.settings import ProcessorSettings
from tests.support.harness import (
    Publisher,
    Reader,
    create_topics,
    headers_for,
    query,
    running,
    settings_for,
    wait_until,
)
from tests.support.raw_headers import produce_raw_headers

pytestmark = pytest.mark.integration

EVENTS = "poison-test-events"
DEAD_LETTERS = "saga-dead-letters"
SAGA_TYPE = "poison-test-tab"


@message_type("tests.poison.TabOpened", topic=EVENTS)
class TabOpened(Message):
    tab_id: str
    amount: int = 0
    remind_in_seconds: float | None = None


@message_type("tests.poison.TabClosed", topic=EVENTS)
class TabClosed(Message):
    tab_id: str


class Gate:
    """The reminder handler's dependency; refuses while ``open`` is False, counts payloads."""

    def __init__(self, open: bool = True) -> None:
        self.open = open
        self.seen: list[int] = []

    def remind(self, n: int) -> None:
        if not self.open:
            raise RuntimeError("reminders are switched off")
        self.seen.append(n)


@saga(type=SAGA_TYPE)
class TabV1(SagaState):
    tab_id: str = ""
    amount: int = 0

    @saga_event_handler(TabOpened, association_property="tab_id", start=True)
    def opened(self, event: TabOpened, deadlines: SagaDeadlines) -> None:
        self.tab_id = event.tab_id
        self.amount = event.amount
        if event.remind_in_seconds is not None:
            after = timedelta(seconds=event.remind_in_seconds)
            deadlines.schedule("remind", after, payload={"n": event.amount})

    @saga_event_handler(TabClosed, association_property="tab_id", end=True)
    def closed(self, event: TabClosed) -> None:
        """Ends the tab."""

    @saga_deadline_handler("remind")
    def remind(self, payload: dict[str, int], gate: Gate) -> None:
        gate.remind(payload["n"])


@saga(type=SAGA_TYPE)
class TabV2(SagaState):
    """The deploy that renamed ``amount`` to ``total`` and forgot the stored rows."""

    tab_id: str = ""
    total: int = 0

    @saga_event_handler(TabOpened, association_property="tab_id", start=True)
    def opened(self, event: TabOpened) -> None:
        self.tab_id = event.tab_id
        self.total = event.amount

    @saga_event_handler(TabClosed, association_property="tab_id", end=True)
    def closed(self, event: TabClosed) -> None:
        """Ends the tab."""


@saga(type=SAGA_TYPE)
class TabV3(SagaState):
    """The fix: the renamed field reads the old name too."""

    tab_id: str = ""
    total: int = Field(default=0, validation_alias=AliasChoices("total", "amount"))

    @saga_event_handler(TabOpened, association_property="tab_id", start=True)
    def opened(self, event: TabOpened) -> None:
        self.tab_id = event.tab_id
        self.total = event.amount

    @saga_event_handler(TabClosed, association_property="tab_id", end=True)
    def closed(self, event: TabClosed) -> None:
        """Ends the tab."""


@dataclass
class Env:
    settings: ProcessorSettings
    pub: Publisher

    @property
    def events(self) -> str:
        return self.settings.topic_prefix + EVENTS

    def db(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        url = self.settings.database.url.get_secret_value()
        return query(url, self.settings.database.schema_name, sql, *args)

    def status(self, tab: str) -> object:
        rows = self.db("SELECT status FROM saga_instance WHERE saga_id = %s", tab)
        return rows[0][0] if rows else None

    def publish(self, *events: TabOpened | TabClosed) -> None:
        for e in events:
            self.pub.event(self.events, e.tab_id, e)
        self.pub.flush()

    def retry(self, cls: type[Any], tab: str, deps: dict[type, Any] | None = None) -> RetryResult:
        bound = bind_sagas(self.settings, [cls], dependencies=deps or {})
        url = self.settings.database.url.get_secret_value()
        with open_operator_queries(url, tables_for(self.settings)) as queries:
            return retry_parked_saga(
                queries, bound.planner, SAGA_TYPE, tab, registry=bound.registry
            )


@pytest.fixture
def env(kafka_bootstrap: str, database_url: str, pg_schema: str) -> Env:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, [prefix + EVENTS, prefix + DEAD_LETTERS])
    settings = settings_for(kafka_bootstrap, database_url, pg_schema, prefix)
    return Env(settings, Publisher(kafka_bootstrap))


def _tab() -> str:
    return f"tab-{uuid.uuid4().hex[:8]}"


def test_records_the_store_cannot_hold_are_dead_lettered_and_good_ones_flow(
    env: Env, kafka_bootstrap: str
) -> None:
    good = [_tab() for _ in range(3)]
    opened = TabOpened(tab_id=good[0], amount=1)
    body = opened.model_dump_json().encode()
    nul_payload = (
        TabOpened(tab_id=good[1], amount=1).model_dump_json().replace(good[1], good[1] + "\\u0000")
    )
    # (key, value, headers, reason); the bad ones share keys with the good sagas.
    bad: list[tuple[bytes, bytes, list[tuple[str, bytes]], str]] = [
        (good[0].encode() + b"\x00", body, headers_for(opened), "invalid-id"),
        (good[0].encode(), body, headers_for(opened, message_id="m\x00"), "invalid-header"),
        (good[1].encode(), body, headers_for(opened, trace="a\x00b"), "invalid-header"),
        (good[1].encode(), nul_payload.encode(), headers_for(opened), "invalid-text"),
        (
            good[2].encode(),
            TabOpened(tab_id="x" * 600).model_dump_json().encode(),
            headers_for(opened),
            "invalid-id",
        ),
        (b"\xff" + good[2].encode(), body, headers_for(opened), "invalid-id"),
    ]
    dead = Reader(kafka_bootstrap, [env.events.replace(EVENTS, DEAD_LETTERS)])
    try:
        with running(env.settings, [TabV1], dependencies={Gate: Gate()}):
            env.publish(TabOpened(tab_id=good[0]))
            for i, (key, value, headers, _) in enumerate(bad):
                env.pub.raw(env.events, key, value, headers)
                if i == 2:
                    env.publish(TabOpened(tab_id=good[1]), TabOpened(tab_id=good[2]))
            env.publish(*(TabClosed(tab_id=t) for t in good))
            total = len(bad) + 6
            wait_until(
                lambda: (
                    env.db("SELECT next_offset FROM consumer_offset WHERE topic = %s", env.events)
                    == [(total,)]
                ),
                timeout=90,
                what="stored offset past every record",
            )
            dead.wait_for(lambda rs: len(rs) >= len(bad), timeout=90, what="dead letters")
        assert sorted(env.db("SELECT saga_id, status FROM saga_instance")) == sorted(
            (t, "ended") for t in good
        )
        rows = env.db('SELECT reason, detail, key FROM dead_letter ORDER BY "offset"')
        assert [(r, bytes(k)) for r, _, k in rows] == [(r, k) for k, _, _, r in bad]
        assert all(d for _, d, _ in rows)
        heads = [dead.headers(m) for m in dead.records]
        assert [h["dead-letter-reason"] for h in heads] == [r for *_, r in bad]
        # The records travel unchanged (only NULs in stored header text are replaced).
        assert [(m.key(), m.value()) for m in dead.records] == [(k, v) for k, v, _, _ in bad]
    finally:
        dead.close()


WARM_UP = 100


def test_a_header_name_that_is_not_utf8_is_dead_lettered_and_the_line_goes_on(
    env: Env, kafka_bootstrap: str
) -> None:
    tab = _tab()
    opened = TabOpened(tab_id=tab, amount=1)
    body = opened.model_dump_json().encode()
    headers = [(k.encode(), v) for k, v in headers_for(opened)] + [(b"\xff\xfe-name", b"x")]
    dead = Reader(kafka_bootstrap, [env.events.replace(EVENTS, DEAD_LETTERS)])
    try:
        with running(env.settings, [TabV1], dependencies={Gate: Gate()}):
            # Enough records first that the interpreter has specialised the consumer's calls:
            # a specialised call reads a broken header list where a fresh one raises.
            env.publish(*(TabOpened(tab_id=_tab()) for _ in range(WARM_UP)), opened)
            # Legal on the wire; confluent-kafka cannot send it, a C, Go or Java producer can.
            produce_raw_headers(kafka_bootstrap, env.events, 0, tab.encode(), body, headers)
            env.publish(TabClosed(tab_id=tab))
            wait_until(
                lambda: env.db("SELECT sum(next_offset) FROM consumer_offset") == [(WARM_UP + 3,)],
                timeout=90,
                what="stored offsets past every record",
            )
            dead.wait_for(lambda rs: len(rs) >= 1, timeout=90, what="the dead letter")
        assert env.status(tab) == "ended"
        rows = env.db("SELECT reason, detail, key FROM dead_letter")
        assert [(r, d, bytes(k)) for r, d, k in rows] == [
            ("invalid-header", "a header name is not valid UTF-8", tab.encode())
        ]
        [record] = dead.records
        assert (record.key(), record.value()) == (tab.encode(), body)
        assert dead.headers(record)["dead-letter-reason"] == "invalid-header"
    finally:
        dead.close()


def test_a_deploy_that_renames_a_state_field_parks_then_a_fixed_retry_finishes(env: Env) -> None:
    tabs = [_tab() for _ in range(100)]
    with running(env.settings, [TabV1], dependencies={Gate: Gate()}):
        env.publish(*(TabOpened(tab_id=t, amount=i) for i, t in enumerate(tabs)))
        wait_until(
            lambda: (
                env.db("SELECT count(*) FROM saga_instance WHERE status = 'active'") == [(100,)]
            ),
            timeout=90,
            what="100 tabs open",
        )
    fresh = _tab()
    with running(env.settings, [TabV2]):
        env.publish(*(TabClosed(tab_id=t) for t in tabs))
        env.publish(TabOpened(tab_id=fresh, amount=5), TabClosed(tab_id=fresh))
        wait_until(
            lambda: (
                env.db("SELECT count(*) FROM saga_instance WHERE status = 'parked'") == [(100,)]
            ),
            timeout=90,
            what="the in-flight tabs parked",
        )
        wait_until(lambda: env.status(fresh) == "ended", timeout=90, what="a new tab finished")
    reasons = env.db("SELECT DISTINCT parked_reason FROM saga_instance WHERE status = 'parked'")
    [(reason,)] = reasons
    assert reason == (
        "stored state does not load into TabV2: ValidationError at amount: "
        "Extra inputs are not permitted"
    )
    # Not fixed: the retry fails and changes nothing.
    assert not env.retry(TabV2, tabs[0]).ok
    for t in tabs:
        result = env.retry(TabV3, t)
        assert result.ok, result.failure
        assert result.status == "ended"
    assert env.db("SELECT count(*) FROM saga_instance WHERE status = 'ended'") == [(101,)]


def test_a_failed_deadline_handler_runs_once_with_its_payload_after_the_fix(env: Env) -> None:
    tab = _tab()
    gate = Gate(open=False)
    with running(env.settings, [TabV1], dependencies={Gate: gate}):
        env.publish(TabOpened(tab_id=tab, amount=7, remind_in_seconds=0))
        wait_until(lambda: env.status(tab) == "parked", timeout=90, what="tab parked")
        # The deadline is kept, and not fired again while the saga is parked.
        assert len(env.db("SELECT id FROM saga_deadline WHERE saga_id = %s", tab)) == 1
        reason = env.db("SELECT parked_reason FROM saga_instance WHERE saga_id = %s", tab)
        assert "remind: RuntimeError: reminders are switched off" in reason[0][0]
        gate.open = True
        result = env.retry(TabV1, tab, {Gate: gate})
        assert result.ok, result.failure
        assert [o.outcome for o in result.outcomes] == ["applied"]
        assert gate.seen == [7]
        assert env.db("SELECT id FROM saga_deadline WHERE saga_id = %s", tab) == []
        assert env.status(tab) == "active"


def test_a_forged_fired_record_for_another_sagas_deadline_is_rejected(env: Env) -> None:
    victim, forger = _tab(), _tab()
    with running(env.settings, [TabV1], dependencies={Gate: Gate()}):
        env.publish(
            TabOpened(tab_id=victim, amount=3, remind_in_seconds=3600),
            TabOpened(tab_id=forger, amount=4),
        )
        wait_until(lambda: env.status(forger) == "active", timeout=90, what="both tabs open")
        [(did,)] = env.db("SELECT id::text FROM saga_deadline WHERE saga_id = %s", victim)
        # The right id and the current token: only the saga id is wrong.
        lease = env.db("SELECT token FROM saga_deadline_lock")
        forged = FiredRecord(SAGA_TYPE, forger, did, "remind", lease[0][0] if lease else 1)
        headers = [(k, v.encode()) for k, v in forged.headers().items()]
        assert forged.headers()["message-type"] == DEADLINE_FIRED
        env.pub.raw(env.events, forger.encode(), forged.value(), headers)
        env.pub.flush()
        wait_until(
            lambda: (
                env.db(
                    "SELECT outcome FROM saga_history WHERE saga_id = %s AND kind = 'deadline'",
                    forger,
                )
                != []
            ),
            timeout=90,
            what="the forged record judged",
        )
    [(outcome, detail)] = env.db("SELECT outcome, detail FROM saga_history WHERE kind = 'deadline'")
    assert outcome == "deadline-rejected"
    assert "another saga" in detail
    assert env.db("SELECT saga_id FROM saga_deadline") == [(victim,)]
    states = dict(env.db("SELECT saga_id, version FROM saga_instance"))
    assert states == {victim: 1, forger: 1}
    assert json.loads(forged.value())["saga_id"] == forger
