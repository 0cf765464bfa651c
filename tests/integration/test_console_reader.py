"""The console as the reader role of deploy/sql/grants.sql: every page reads, nothing writes."""

from __future__ import annotations

import httpx
import psycopg
import pytest

from processor._console import Backend, create_app
from processor.settings import ProcessorSettings
from tests.integration.test_console import _serve
from tests.support.console import FormClient
from tests.support.roles import LeastPrivilege

pytestmark = pytest.mark.integration


def test_the_reader_role_serves_every_page_and_cannot_change_a_row(
    least_privilege_db: LeastPrivilege, kafka_bootstrap: str
) -> None:
    db = least_privilege_db
    settings = ProcessorSettings(
        sagas=["sagas"],
        kafka={"bootstrap_servers": kafka_bootstrap},
        database={"url": db.reader_url, "schema_name": db.schema},
    )
    with _serve(create_app(Backend(settings, by="reader-test"))) as base:
        for path in ("/", "/sagas", "/stuck", "/dead-letters", "/failed-outbox"):
            page = httpx.get(base + path, timeout=30)
            assert page.status_code == 200, (path, page.text[:300])
    with psycopg.connect(db.reader_url) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f'DELETE FROM "{db.schema}".dead_letter')
        conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f'CREATE TABLE "{db.schema}".x (a int)')


def test_with_anonymous_reading_off_every_page_asks_for_a_sign_in_but_the_probes(
    least_privilege_db: LeastPrivilege, kafka_bootstrap: str
) -> None:
    from processor._console.auth import Authenticator

    db = least_privilege_db
    settings = ProcessorSettings(
        sagas=["sagas"],
        kafka={"bootstrap_servers": kafka_bootstrap},
        database={"url": db.reader_url, "schema_name": db.schema},
    )
    auth = Authenticator(keys={"vera": ("vera-key-0123456789", "viewer")}, anonymous=None)
    with _serve(create_app(Backend(settings, by="reader-test"), auth=auth)) as base:
        page = httpx.get(base + "/sagas", timeout=30)
        assert page.status_code == 303
        assert page.headers["location"] == "/login"
        assert httpx.get(base + "/api/saga/t/x", timeout=30).status_code == 401
        assert httpx.get(base + "/healthz", timeout=30).status_code == 200
        with FormClient(base) as client:
            signed = client.sign_in("vera", "vera-key-0123456789")
            assert signed.status_code == 303
            assert client.http.get("/sagas").status_code == 200
        with FormClient(base) as stranger:
            assert stranger.sign_in("vera", "nope").status_code == 403
