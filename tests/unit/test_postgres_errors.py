"""psycopg errors become runtime failures by SQLSTATE class."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from processor._errors import Failure, RecordDataError
from processor._postgres.errors import citus_copy_sqlstate, translate, unsharded


@pytest.mark.parametrize(
    ("sqlstate", "kind"),
    [
        ("08006", Failure.RETRYABLE),
        ("57P01", Failure.RETRYABLE),
        ("40001", Failure.RETRYABLE),
        ("40P01", Failure.RETRYABLE),
        ("55P03", Failure.RETRYABLE),
        ("53300", Failure.RETRYABLE),
        ("22P02", Failure.RECORD_DATA),
        ("23505", Failure.RECORD_DATA),
        ("54000", Failure.RECORD_DATA),
        ("42P01", Failure.FATAL),
        ("57014", Failure.RETRYABLE),  # statement timeout, or cancelled by an operator
    ],
)
def test_sqlstate_classes(sqlstate: str, kind: Failure) -> None:
    error = errors.lookup(sqlstate)("server text")
    assert translate(error).kind is kind


def test_record_data_keeps_the_sqlstate_and_not_the_full_text() -> None:
    error = errors.lookup("23505")("duplicate key value: Key (id)=(alice@example.com) exists")
    failure = translate(error)
    assert isinstance(failure, RecordDataError)
    assert failure.sqlstate == "23505"
    assert "alice" not in str(failure)


def test_client_side_connection_errors_are_retryable() -> None:
    assert translate(psycopg.OperationalError("connection failed")).kind is Failure.RETRYABLE
    assert translate(psycopg.InterfaceError("cursor already closed")).kind is Failure.FATAL


@pytest.mark.parametrize(
    ("message", "sqlstate", "kind"),
    [
        (
            'duplicate key value violates unique constraint "saga_instance_pkey_102"',
            "23505",
            Failure.RECORD_DATA,
        ),
        (
            "index row size 2720 exceeds btree version 4 maximum 2704 for index",
            "54000",
            Failure.RECORD_DATA,
        ),
        (
            'null value in column "saga_id" of relation "outbox_102" violates',
            "23502",
            Failure.RECORD_DATA,
        ),
        ("canceling statement due to statement timeout", "57000", Failure.RETRYABLE),
        ("could not extend file: No space left on device", "57000", Failure.RETRYABLE),
        ("terminating connection due to administrator command", "57000", Failure.RETRYABLE),
    ],
)
def test_a_citus_worker_refusal_gets_its_class_back_from_its_message(
    message: str, sqlstate: str, kind: Failure
) -> None:
    # Citus reports a worker's refusal of copied rows as XX000 with the worker's message: a
    # duplicate must be refused data (isolated, dead-lettered), not a fatal error that restarts
    # the replica on the same batch again and again; anything unknown is tried again.
    assert citus_copy_sqlstate(message) == sqlstate
    assert translate(errors.lookup(sqlstate)(message)).kind is kind


def test_a_citus_workers_shard_names_are_given_back_as_the_tables() -> None:
    assert (
        unsharded('new row for relation "holds_118508" violates check constraint "no_held"')
        == 'new row for relation "holds" violates check constraint "no_held"'
    )
    assert (
        unsharded('duplicate key value violates unique constraint "holds_pkey_118508"')
        == 'duplicate key value violates unique constraint "holds_pkey"'
    )
    # A name of one's own that ends in a short number stays as it is.
    assert (
        unsharded('relation "orders_2024" does not exist')
        == 'relation "orders_2024" does not exist'
    )
