"""Batch operator actions without services: `--where`, the confirmation rule, the selection's
paging and cap, the batch id signed into each record and carried into its audit entry."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any, cast

import pytest

from processor._cli.main import build_parser
from processor._engine.records import Record
from processor._errors import SagaError
from processor._memory.store import MemoryBatchStore
from processor._ports import InspectStore
from processor._ports.views import SagaSummary
from processor._wire import OperatorAction, OperatorRecord, operator_signed
from processor.ops._batch import confirmation, confirmed, parse_where, select
from tests.unit.test_plan import NOW, SAGA, Gate, Log, Opened
from tests.unit.test_plan_retry import ISSUED_AT, KEY, _batch, _planner

# -- --where -----------------------------------------------------------------------------------


def test_where_reads_the_list_filters_and_their_aliases_split_on_the_first_equals() -> None:
    assert parse_where(
        [
            "type=transfer-saga",
            "attr=address.country=DE",
            "age=2h",
            "correlation_id=c-1",
            "Machine-State=WAITING",
            "status=active",
            "outcome=FAILED",
        ]
    ) == {
        "type": "transfer-saga",
        "attr": "address.country=DE",
        "older_than": "2h",
        "correlation": "c-1",
        "state": "WAITING",
        "status": "active",
        "outcome": "FAILED",
    }
    # The same filter twice with one value is no conflict.
    assert parse_where(["type=a", "saga_type=a"]) == {"type": "a"}


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["type"], "--where 'type': write KEY=VALUE"),
        (["=x"], "--where '=x': write KEY=VALUE"),
        (["colour=red"], "--where 'colour': not a filter (keys: type, status"),
        (["after=x|y|z"], "--where 'after': not a filter"),
        (["type= "], "--where type: no value"),
        (["type=a", "type=b"], "--where type given twice"),
        ([], "select the sagas with --where KEY=VALUE"),
    ],
)
def test_a_where_that_is_no_filter_is_refused_naming_it(items: list[str], message: str) -> None:
    with pytest.raises(SagaError) as e:
        parse_where(items)
    assert str(e.value).startswith(message)


# -- the confirmation --------------------------------------------------------------------------


def test_more_sagas_than_the_threshold_ask_at_a_terminal_and_are_refused_elsewhere() -> None:
    assert confirmation(20, 20, yes=False, interactive=False) == "go"
    assert confirmation(0, 20, yes=False, interactive=False) == "go"
    assert confirmation(21, 20, yes=False, interactive=True) == "ask"
    assert confirmation(21, 20, yes=False, interactive=False) == "refuse"
    assert confirmation(21, 20, yes=True, interactive=False) == "go"
    assert confirmation(1, 0, yes=False, interactive=False) == "refuse"
    # Only the count typed back goes on.
    assert confirmed("200\n", 200)
    assert confirmed(" 200 ", 200)
    assert not confirmed("y", 200)
    assert not confirmed("20", 200)
    assert not confirmed("", 200)


# -- the selection -----------------------------------------------------------------------------


class Sagas:
    """The sagas list's paging over rows in memory, as `InspectQueries.list_sagas` pages."""

    def __init__(self, rows: list[SagaSummary]) -> None:
        self.rows = sorted(rows, key=lambda r: (r.updated_at, r.saga_type, r.saga_id))
        self.calls: list[dict[str, Any]] = []

    def list_sagas(self, **filters: Any) -> list[SagaSummary]:
        self.calls.append(filters)
        after = filters["after"]
        return [
            r
            for r in self.rows
            if r.status == filters["status"]
            and (filters["saga_type"] in (None, r.saga_type))
            and (after is None or (r.updated_at, r.saga_type, r.saga_id) > after)
        ][: filters["limit"]]


def _saga(n: int, status: str = "active", saga_type: str = "t") -> SagaSummary:
    at = NOW + timedelta(seconds=n)
    return SagaSummary(saga_type, f"s-{n:04d}", status, None, at, 1, at, at, None)


def _select(rows: list[SagaSummary], action: str, where: dict[str, str], limit: int) -> Any:
    store = Sagas(rows)
    return select(cast(InspectStore, store), action, where, limit), store


def test_a_selection_pages_by_the_cursor_skips_ended_sagas_and_says_when_capped() -> None:
    rows = [_saga(n) for n in range(1200)] + [_saga(n, "parked") for n in range(1200, 1210)]
    rows += [_saga(n, "ended") for n in range(1210, 1220)] + [_saga(9999, saga_type="other")]
    chosen, store = _select(rows, "cancel", {"type": "t"}, 10_000)
    assert [s.saga_id for s in chosen.sagas] == [f"s-{n:04d}" for n in range(1210)]
    assert not chosen.capped
    # Pages of 500, the active sagas then the parked ones; never the ended ones.
    assert [(c["status"], c["limit"]) for c in store.calls] == [
        ("active", 500),
        ("active", 500),
        ("active", 500),
        ("parked", 500),
    ]
    assert store.calls[1]["after"] == (rows[499].updated_at, "t", "s-0499")

    capped, _ = _select(rows, "cancel", {"type": "t"}, 1000)
    assert (len(capped.sagas), capped.capped, capped.sagas[-1].saga_id) == (1000, True, "s-0999")
    exact, _ = _select(rows, "cancel", {"type": "t"}, 1210)
    assert (len(exact.sagas), exact.capped) == (1210, False)
    # Retry selects parked sagas only; an explicit status is taken as given.
    parked, _ = _select(rows, "retry", {"type": "t"}, 10_000)
    assert [s.status for s in parked.sagas] == ["parked"] * 10
    ended, _ = _select(rows, "terminate", {"status": "ended"}, 10_000)
    assert len(ended.sagas) == 10


@pytest.mark.parametrize(
    ("action", "where", "message"),
    [
        ("retry", {"status": "active"}, "retry replays parked sagas"),
        ("cancel", {"outcome": "FAILED"}, "--where outcome matches ended sagas"),
        ("cancel", {"status": "gone"}, "bad --where status: one of active, parked, ended"),
        ("cancel", {"older_than": "soon"}, "bad --where older_than"),
        ("reset", {"type": "t"}, "a batch 'reset': one of cancel, terminate, retry, resolve"),
    ],
)
def test_a_selection_the_action_never_acts_on_is_refused(
    action: str, where: dict[str, str], message: str
) -> None:
    with pytest.raises(SagaError) as e:
        _select([], action, where, 10)
    assert str(e.value).startswith(message)


# -- the command line --------------------------------------------------------------------------


def test_one_saga_or_where_and_the_options_that_go_with_each() -> None:
    from processor._cli.batch import check_single

    def single(line: str) -> Any:
        args = build_parser().parse_args(["saga", *line.split()])
        check_single(args)
        return args

    retry = single("retry t s-1 --reason fixed")
    assert (retry.saga_type, retry.saga_id, retry.wait) == ("t", "s-1", 60.0)
    assert single("resolve t s-1 skip --reason r").decision == "skip"
    assert single("resolve t s-1 --decision skip --reason r").decision == "skip"
    for line, message in (
        ("cancel --reason r", "saga cancel SAGA_TYPE SAGA_ID --reason WHY, or select sagas"),
        ("cancel t --reason r", "saga cancel SAGA_TYPE SAGA_ID"),
        ("cancel t s-1", "--reason WHY is required"),
        ("cancel t s-1 --reason r --dry-run --yes", "--dry-run, --yes go with --where"),
        ("resolve t s-1 --reason r", "saga resolve SAGA_TYPE SAGA_ID DECISION"),
        ("resolve t s-1 skip --decision retry --reason r", "two decisions"),
    ):
        with pytest.raises(SagaError) as e:
            single(line)
        assert str(e.value).startswith(message), line
    batch = build_parser().parse_args(["saga", "cancel", "--where", "type=t", "--where", "age=1h"])
    assert (batch.saga_type, batch.where, batch.reason) == (None, ["type=t", "age=1h"], None)


# -- the batch id on the wire and in the trail -------------------------------------------------


def test_a_batch_id_is_signed_with_the_record_and_absent_from_a_record_without_one() -> None:
    one = OperatorRecord(OperatorAction.CANCEL, "s", "s-1", "c-1", "ada", "why", issued_at=1)
    assert "batch" not in json.loads(one.value())
    batched = dataclasses.replace(one, batch="b-1")
    assert json.loads(batched.value())["batch"] == "b-1"
    assert OperatorRecord.parse(batched.value()) == batched
    # Signed: the batch cannot be changed (or dropped) without the key.
    signature = batched.headers(b"key")["operator-auth"]
    assert not operator_signed(b"key", one.value(), signature)
    assert not operator_signed(b"key", dataclasses.replace(batched, batch="b-2").value(), signature)


def test_the_processor_records_a_batched_request_with_the_batch_in_its_target() -> None:
    store, log = MemoryBatchStore(clock=lambda: NOW), Log()
    planner = _planner(Gate())
    _batch(planner, store, [log.event(Opened(order_id="o1"))])
    log.offset += 1
    request = OperatorRecord(
        OperatorAction.TERMINATE, SAGA, "o1", "c1", "ana", "batch", issued_at=ISSUED_AT, batch="b1"
    )
    headers = tuple((k, v.encode()) for k, v in request.headers(KEY).items())
    ws = _batch(planner, store, [Record("in", 0, log.offset, b"o1", request.value(), headers)])
    [entry] = ws.audit
    assert (entry.action, entry.outcome) == ("terminate", "applied")
    assert entry.target == {"request": "operator:c1", "batch": "b1", "version": 2}
    assert [r.saga_id for r in store.tables.audit.audit(batch="b1")] == ["o1"]
    assert store.tables.audit.audit(batch="b2") == []
