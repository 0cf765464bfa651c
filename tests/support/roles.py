"""Per-test database roles made by deploy/sql/grants.sql: an owner that migrates, and a runtime
role the processor runs as (not a superuser)."""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from processor._postgres.connect import ensure_schema
from processor._postgres.schema.tables import Tables

GRANTS = Path(__file__).resolve().parents[2] / "deploy" / "sql" / "grants.sql"
_VARIABLE = re.compile(r':"([a-z_]+)"')


def render_grants(conn: psycopg.Connection[object], **names: str) -> str:
    """grants.sql as psql would run it with `-v name=value`: identifiers quoted, meta-commands
    (`\\set`) dropped."""
    lines = [line for line in GRANTS.read_text().splitlines() if not line.startswith("\\")]
    text = "\n".join(lines)
    missing = set(_VARIABLE.findall(text)) - names.keys()
    if missing:
        raise KeyError(f"grants.sql needs {sorted(missing)}")
    return _VARIABLE.sub(lambda m: sql.Identifier(names[m.group(1)]).as_string(conn), text)


@dataclass(frozen=True)
class LeastPrivilege:
    """A schema migrated by its owner role, and the URL of the role the processor runs as."""

    schema: str
    owner: str
    runtime: str
    owner_url: str
    runtime_url: str
    reader_url: str


@contextmanager
def least_privilege(admin_url: str, schema: str) -> Iterator[LeastPrivilege]:
    """Creates roles with unique names, grants per grants.sql, migrates `schema` as the owner;
    drops the schema and both roles afterwards."""
    tag = uuid.uuid4().hex[:8]
    owner, runtime, reader = f"t_owner_{tag}", f"t_runtime_{tag}", f"t_reader_{tag}"
    passwords = {role: secrets.token_hex(12) for role in (owner, runtime, reader)}
    database = str(conninfo_to_dict(admin_url)["dbname"])
    with psycopg.connect(admin_url, autocommit=True) as admin:
        try:
            with _catalog_lock(admin):
                admin.execute(
                    render_grants(
                        admin,
                        database=database,
                        schema=schema,
                        owner=owner,
                        runtime=runtime,
                        reader=reader,
                    ).encode()
                )
            for role, password in passwords.items():
                admin.execute(
                    sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                        sql.Identifier(role), sql.Literal(password)
                    )
                )
            urls = {
                role: make_conninfo(admin_url, user=role, password=password)
                for role, password in passwords.items()
            }
            ensure_schema(urls[owner], Tables(schema))
            yield LeastPrivilege(schema, owner, runtime, urls[owner], urls[runtime], urls[reader])
        finally:
            roles = [owner, runtime, reader]
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(%s)",
                (roles,),
            )
            admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
            with _catalog_lock(admin):
                for role in roles:
                    exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
                    if exists.fetchone() is not None:
                        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# Grants on the database and role changes of tests running at once update the same catalog rows
# (the database's ACL): PostgreSQL refuses the second of two such updates at the same moment
# with "tuple concurrently updated" (seen as a teardown error of an end-to-end test).
_CATALOG_LOCK = 0x5A6A_0001


@contextmanager
def _catalog_lock(admin: psycopg.Connection[Any]) -> Iterator[None]:
    admin.execute("SELECT pg_advisory_lock(%s)", (_CATALOG_LOCK,))
    try:
        yield
    finally:
        admin.execute("SELECT pg_advisory_unlock(%s)", (_CATALOG_LOCK,))
