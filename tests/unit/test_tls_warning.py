"""The startup warning about database connections whose server identity is not verified."""

from __future__ import annotations

import pytest

from processor._postgres.tls import unverified_tls


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://saga@127.0.0.1:5432/saga",
        "postgresql://saga@localhost/saga",
        "postgresql://saga@[::1]:5432/saga",
        "postgresql:///saga?host=/var/run/postgresql",
        "postgresql://saga@db.example.com/saga?sslmode=verify-full",
        "host=db.example.com sslmode=verify-full dbname=saga",
        "postgresql://saga@127.0.0.1,localhost/saga",
    ],
)
def test_loopback_or_verified_tls_is_quiet(url: str) -> None:
    assert unverified_tls(url, environ={}) is None


@pytest.mark.parametrize(
    ("url", "mode"),
    [
        ("postgresql://saga@db.example.com/saga", "prefer"),
        ("postgresql://saga@10.0.0.5/saga?sslmode=require", "require"),
        ("postgresql://saga@db.example.com/saga?sslmode=verify-ca", "verify-ca"),
        ("postgresql://saga@db.example.com/saga?sslmode=disable", "disable"),
        ("postgresql://saga@127.0.0.1,db.example.com/saga", "prefer"),
    ],
)
def test_a_remote_host_without_verify_full_is_named(url: str, mode: str) -> None:
    reason = unverified_tls(url, environ={})
    assert reason is not None
    assert "db.example.com" in reason or "10.0.0.5" in reason
    assert f"sslmode={mode}" in reason
    assert "127.0.0.1" not in reason


def test_libpq_environment_fills_what_the_url_leaves_out() -> None:
    assert unverified_tls("postgresql:///saga", environ={"PGHOST": "db.example.com"}) is not None
    verified = {"PGHOST": "db.example.com", "PGSSLMODE": "verify-full"}
    assert unverified_tls("postgresql:///saga", environ=verified) is None
