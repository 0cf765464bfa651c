"""The console's filters and cluster view without a database: parsing, statements, merging."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from processor._console.query import list_filters as _list_filters
from processor._errors import SagaError
from processor._ports.cluster import (
    ClusterView,
    DeadlineLease,
    PartitionRow,
    RelayBacklog,
    replicas_of,
    with_lag,
)
from processor._ports.views import consumer_lag
from processor._postgres.reads.inspect import list_statement
from processor.ops._filters import StateSearchError, state_documents

AT = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "documents"),
    [
        ("customer_id=c-7", [{"customer_id": "c-7"}]),
        (" address.country = DE ", [{"address": {"country": "DE"}}]),
        ("amount=42", [{"amount": 42}, {"amount": "42"}]),
        ("ok=true", [{"ok": True}, {"ok": "true"}]),
        ('order_id="42"', [{"order_id": "42"}]),
        ("note=a=b", [{"note": "a=b"}]),
        ("empty=", [{"empty": ""}]),
        # Only scalars: an array or object would match by containment, not equality.
        ("items=[1]", [{"items": "[1]"}]),
    ],
)
def test_a_state_search_becomes_containment_documents(
    text: str, documents: list[dict[str, Any]]
) -> None:
    assert state_documents(text) == documents


@pytest.mark.parametrize("text", ["customer_id", "=c-7", "a..b=1", "a.=1", "x" * 501 + "=1"])
def test_a_state_search_that_is_not_path_value_is_refused(text: str) -> None:
    with pytest.raises(StateSearchError):
        state_documents(text)


def test_the_list_statement_holds_only_the_filters_given() -> None:
    params: dict[str, Any] = {"type": "t", "status": None, "outcome": "FAILED", "limit": 50}
    text = list_statement(params, state_documents("amount=3"))
    assert "saga_type = %(type)s" in text
    assert "status = %(status)s" not in text
    assert "status = 'ended' AND machine_state = %(outcome)s" in text
    assert "(state @> %(doc0)s::jsonb OR state @> %(doc1)s::jsonb)" in text
    assert (params["doc0"], params["doc1"]) == ('{"amount": 3}', '{"amount": "3"}')
    assert "{history}" not in text
    assert text.rstrip().endswith("ORDER BY s.updated_at, s.saga_type, s.saga_id LIMIT %(limit)s")
    assert "WHERE saga_type = p.saga_type AND status = p.status\n" in list_statement({"limit": 50})


def test_a_correlation_id_looks_its_sagas_up_first_and_filters_each() -> None:
    params: dict[str, Any] = {"correlation": "conv", "status": "ended", "limit": 50}
    text = list_statement(params)
    assert "FROM {history}" in text
    assert "saga_id = c.saga_id AND status = %(status)s LIMIT 1" in text
    assert "{where}" not in text
    assert "ORDER BY s.updated_at, s.saga_type, s.saga_id" in text


def test_the_query_string_becomes_list_filters() -> None:
    filters = _list_filters(
        {
            "type": "t",
            "outcome": "TIMED_OUT",
            "correlation": " conv-1 ",
            "attr": "customer_id=c-7",
            "older_than": "2h",
            "after": f"{AT.isoformat()}|t|s-1",
            "refresh": "10",
        }
    )
    assert filters == {
        "saga_type": "t",
        "status": None,
        "machine_state": None,
        "older_than": timedelta(hours=2),
        "after": (AT, "t", "s-1"),
        "outcome": "TIMED_OUT",
        "correlation_id": "conv-1",
        "state_contains": [{"customer_id": "c-7"}],
    }
    assert _list_filters({"outcome": "", "attr": " "})["state_contains"] == []
    for bad in ({"outcome": "DONE"}, {"attr": "nothing"}, {"after": "x"}, {"older_than": "?"}):
        with pytest.raises(SagaError):
            _list_filters(bad)


def _partition(part: int, owner: str | None, at: datetime = AT) -> PartitionRow:
    return PartitionRow("in", part, owner, 1, 10, at, RelayBacklog(0, None, 0))


def test_replicas_are_the_owners_then_the_other_connected_ones() -> None:
    later = AT + timedelta(seconds=30)
    partitions = [_partition(0, "b"), _partition(1, "a"), _partition(2, "b", later)]
    lease = DeadlineLease("a", 3, later, timedelta(seconds=5))
    replicas = replicas_of(partitions, {"b": 4, "idle": 2}, lease)
    seen = [(r.instance_id, r.partitions, r.last_write, r.connections) for r in replicas]
    assert seen == [("a", 1, AT, 0), ("b", 2, later, 4), ("idle", 0, None, 2)]
    assert [r.holds_lease for r in replicas] == [True, False, False]
    lapsed = DeadlineLease("a", 3, AT, timedelta(seconds=-1))
    assert not any(r.holds_lease for r in replicas_of(partitions, {}, lapsed))


def test_the_lag_is_merged_per_partition_when_the_broker_answered() -> None:
    view = ClusterView(
        "g", [], [_partition(0, "a"), _partition(1, "a")], None, RelayBacklog(0, None, 0), 10
    )
    assert with_lag(view, None) is view
    lag = consumer_lag({("in", 0): 10, ("in", 1): 10}, {("in", 0): (0, 25)})
    merged = with_lag(view, lag)
    assert [(p.high, p.lag) for p in merged.partitions] == [(25, 15), (None, None)]
    assert merged.lag == 15
