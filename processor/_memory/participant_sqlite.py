"""The participant kit's store in memory, with the service's own tables in SQLite.

:class:`~processor._memory.participant.MemoryParticipantStore` keeps the kit's tables (inbox,
outbox, positions); this store adds an in-memory SQLite database (the standard library's
``sqlite3``) behind the handlers' :class:`~processor._ports.participant.Sql`, so a participant's
own reads see its own writes in a unit test. One command's transaction spans both: the SQLite
transaction commits, and then the kit's tables are published, only when the block ends normally,
so a handler that raises leaves no row anywhere, as with PostgreSQL.

The handler's statements are PostgreSQL's as the service writes them: ``%s`` and ``%(name)s``
placeholders (``%%`` for a percent sign) become SQLite's ``?`` and ``:name``. What SQLite cannot
run fails as it would against a database that refuses the statement; see
:class:`SqliteSql` for the dialect's limits.
"""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from processor._engine.records import OutboxRow
from processor._errors import RecordDataError, RuntimeFailure
from processor._memory.participant import MemoryParticipantStore
from processor._ports.participant import Claim, InboxEntry, ParticipantTx, Rows

__all__ = ["SqliteParticipantStore", "SqliteParticipantTx", "SqliteSql", "translate"]

TP = tuple[str, int]

# psycopg's placeholders: %s (and the binary and text variants %b, %t), named or not, and %%.
_PLACEHOLDER = re.compile(r"%(?:\((?P<name>[^)]*)\))?(?P<kind>.?)", re.DOTALL)
# The demo's services point each transaction at their schema; here there is only one.
_SEARCH_PATH = re.compile(r"\s*SET\s+(?:LOCAL\s+|SESSION\s+)?search_path\b", re.IGNORECASE)
# The kit ends the command's transaction; a handler that ends it would commit half a command.
_TX_CONTROL = re.compile(
    r"\s*(?:BEGIN|COMMIT|END|ROLLBACK(?!\s+(?:TRANSACTION\s+)?TO\b)|START\s+TRANSACTION)\b",
    re.IGNORECASE,
)
_ROLLBACK_TO = re.compile(r"\s*ROLLBACK\s+(?:TRANSACTION\s+)?TO\b", re.IGNORECASE)


def translate(e: sqlite3.Error) -> RuntimeFailure:
    """The runtime failure a SQLite error means, as :mod:`processor._postgres.errors` decides.

    A constraint violation or refused data is :class:`RecordDataError` (the kit dead-letters
    the command); anything else (a syntax error, an unknown table) is fatal, as in PostgreSQL.
    SQLite's messages name the constraint, never the offending values.
    """
    code = getattr(e, "sqlite_errorname", None) or type(e).__name__
    if isinstance(e, sqlite3.IntegrityError | sqlite3.DataError):
        return RecordDataError(code, str(e))
    return RuntimeFailure(f"database error ({code}): {e}")


class _Rows:
    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self._rows = rows
        self._rowcount = rowcount

    @property
    def rowcount(self) -> int:
        return self._rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows


def _adapt(value: Any) -> Any:
    # What psycopg sends as numeric, timestamptz or uuid: SQLite stores the text, and a column
    # of numeric affinity turns a number's text into a number (read back as int or float).
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return value


def _convert(
    query: str, params: Sequence[Any] | Mapping[str, Any]
) -> tuple[str, Sequence[Any] | dict[str, Any]]:
    """The query with SQLite's placeholders, and its parameters as SQLite binds them."""
    kinds: set[str] = set()

    def placeholder(m: re.Match[str]) -> str:
        name, kind = m.group("name"), m.group("kind")
        if name is None and kind == "%":
            return "%"
        if kind not in ("s", "b", "t"):
            raise RuntimeFailure(
                f"database client error: only '%s', '%(name)s' and '%%' are placeholders, "
                f"got {m.group(0)!r}"
            )
        if name is None:
            kinds.add("positional")
            return "?"
        if not name.isidentifier():
            raise RuntimeFailure(f"database client error: placeholder name {name!r}")
        kinds.add("named")
        return f":{name}"

    text = _PLACEHOLDER.sub(placeholder, query)
    if len(kinds) > 1:
        raise RuntimeFailure("database client error: positional and named placeholders mixed")
    if isinstance(params, Mapping):
        return text, {k: _adapt(v) for k, v in params.items()}
    return text, [_adapt(v) for v in params]


class SqliteSql:
    """:class:`processor._ports.participant.Sql` over an in-memory SQLite database.

    For unit tests: integration tests should run the service against its real PostgreSQL
    database. SQLite (3.35 or later) runs the common statements, ``INSERT ... ON CONFLICT ...
    DO UPDATE`` and ``RETURNING`` included; PostgreSQL-only syntax does not run (``::`` casts,
    ``DELETE ... USING``, ``FOR UPDATE``, ``jsonb`` operators, ``now()``) and fails as fatal,
    as an unknown statement would in PostgreSQL. Other differences: types are loose (a
    ``numeric`` column reads back as ``int`` or ``float``, a ``boolean`` as ``0`` or ``1``), a
    division by zero gives NULL, one ``execute`` runs one statement, and ``SET [LOCAL]
    search_path`` is accepted and ignored (the tables live in one database).

    As in PostgreSQL, a statement that failed leaves the transaction unusable: later statements
    fail, and the transaction cannot commit, unless the handler rolled back to a savepoint.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.failed: str | None = None
        """Why the transaction is unusable: the failed statement's error, if any."""

    def execute(self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Rows:
        if _SEARCH_PATH.match(query):
            return _Rows([], 0)
        if _TX_CONTROL.match(query):
            raise RuntimeFailure(
                "database client error: the kit commits or rolls back the command's "
                f"transaction; a handler may not ({query.split(maxsplit=1)[0]})"
            )
        rolling_back = _ROLLBACK_TO.match(query) is not None
        if self.failed is not None and not rolling_back:
            raise RuntimeFailure(
                "database error (25P02): current transaction is aborted, commands ignored "
                f"until end of transaction block (after: {self.failed})"
            )
        text, args = _convert(query, params)
        try:
            cursor = self._conn.execute(text, args)
            returns = cursor.description is not None
            rows = cursor.fetchall() if returns else []
        except sqlite3.Error as e:
            failure = translate(e)
            self.failed = str(failure)
            raise failure from e
        if rolling_back:
            self.failed = None
        # psycopg counts the rows a statement returned; sqlite3 only those it changed.
        return _Rows(rows, len(rows) if returns else max(cursor.rowcount, 0))


class SqliteParticipantTx:
    """A transaction: the kit's tables in memory, the service's in SQLite."""

    def __init__(self, tables: ParticipantTx, sql: SqliteSql) -> None:
        self._tables = tables
        self._sql = sql

    @property
    def sql(self) -> SqliteSql:
        """The handler's connection, inside this transaction."""
        return self._sql

    def bucket_of(self, message_id: str) -> int:
        # One database, one bucket: a handler that writes it runs the same on tables by bucket.
        return 0

    def claim(
        self,
        message_id: str,
        message_type: str,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None = None,
    ) -> InboxEntry | None:
        return self._tables.claim(message_id, message_type, topic, partition, offset)

    def claim_all(self, claims: Sequence[Claim]) -> dict[str, InboxEntry | None]:
        return self._tables.claim_all(claims)

    def finish(self, message_id: str, outcome: str, replies: Sequence[OutboxRow]) -> None:
        self._tables.finish(message_id, outcome, replies)

    def publish(self, rows: Sequence[OutboxRow]) -> None:
        self._tables.publish(rows)

    def advance(self, group_id: str, topic: str, partition: int, next_offset: int) -> None:
        self._tables.advance(group_id, topic, partition, next_offset)


class SqliteParticipantStore:
    """:class:`processor._ports.participant.ParticipantStore` in memory, handlers' SQL in SQLite.

    Args:
        schema: SQL script creating (and filling) the service's own tables, in SQLite's
            dialect; run once, outside any command.

    Attributes:
        memory: The kit's tables (``memory.tables``: inbox, outbox, offsets).
        connection: The SQLite database (autocommit at the driver; transactions are explicit).

    Raises:
        ValueError: SQLite refused the schema script.
    """

    def __init__(self, schema: str = "") -> None:
        self.memory = MemoryParticipantStore()
        # isolation_level=None: the driver opens no transaction of its own; BEGIN is ours.
        self.connection = sqlite3.connect(":memory:", isolation_level=None)
        # PostgreSQL always checks foreign keys; SQLite only when asked.
        self.connection.execute("PRAGMA foreign_keys = ON")
        if schema:
            try:
                self.connection.executescript(schema)
            except sqlite3.Error as e:
                self.connection.close()
                raise ValueError(
                    f"SQLite refused the schema script: {e} (it runs SQLite's dialect, not "
                    "PostgreSQL's)"
                ) from e

    def positions(self, group_id: str, partitions: Sequence[TP]) -> Mapping[TP, int | None]:
        return self.memory.positions(group_id, partitions)

    @contextmanager
    def transaction(self) -> Iterator[SqliteParticipantTx]:
        conn = self.connection
        conn.execute("BEGIN")
        sql = SqliteSql(conn)
        try:
            with self.memory.transaction() as tables:
                yield SqliteParticipantTx(tables, sql)
                if sql.failed is not None:
                    # PostgreSQL turns the COMMIT of an aborted transaction into a rollback,
                    # and the kit's next statement on it fails: the command is not done.
                    raise RuntimeFailure(
                        "database error (25P02): the transaction was aborted by a failed "
                        f"statement the handler went on after: {sql.failed}"
                    )
                try:
                    # Inside the memory block: a refused commit publishes no inbox row either.
                    conn.execute("COMMIT")
                except sqlite3.Error as e:
                    raise translate(e) from e
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.connection.close()
