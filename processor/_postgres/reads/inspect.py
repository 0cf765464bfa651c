"""SQL behind `show`, `sagas list|stuck`, `dead-letters ...` and the web console.

Every query is served by an index (see migration 5) and bounded by a limit; lists page by key
(`after`/`before` cursors), never by offset, so a page costs the same on a million sagas.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Unpack

from psycopg.types.numeric import Int4

from processor._engine.rows import AUDIT_IDS, AuditEntry
from processor._ports.views import (
    AuditFilters,
    AuditRow,
    DeadLetterRow,
    FailedRow,
    HeldRow,
    Overview,
    PendingDeadline,
    SagaSummary,
    TimelineEntry,
    TypeStatusCount,
    payload_text,
)
from processor._postgres.connect import connect
from processor._postgres.dead_letter_sql import DEAD_LETTER, DEAD_LETTER_OF, DEAD_LETTERS, PURGE
from processor._postgres.held import Conn, OwnedConnection
from processor._postgres.reads.audit import AuditSql, encode_entries
from processor._postgres.schema.buckets import read_layout
from processor._postgres.schema.tables import Tables
from processor._wire import HEADER_CORRELATION_ID, HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE

__all__ = ["InspectQueries", "open_inspect_queries"]

_SUMMARY = """
    saga_type, saga_id, status, machine_state, coalesce(machine_state_since, updated_at), version,
    created_at, updated_at, parked_reason
"""
_SAGA = f"SELECT {_SUMMARY}, state FROM {{instance}} WHERE saga_type = %s AND saga_id = %s"
# An id alone: the saga types by a skip scan (one index step per type, as in _OVERVIEW), then
# one primary key lookup per type. No index of its own on saga_id: every saga write would pay
# for it (migration 11), and saga types are few (one per saga class). LIMIT 1 (a key has one
# row) keeps the lookup a subquery per type, which the planner cannot turn into one walk of
# the whole primary key filtered by saga_id.
_FIND = f"""
    WITH RECURSIVE types AS (
        (SELECT saga_type FROM {{instance}} ORDER BY saga_type LIMIT 1)
        UNION ALL
        SELECT n.saga_type FROM types AS p, LATERAL (
            SELECT saga_type FROM {{instance}} WHERE saga_type > p.saga_type
             ORDER BY saga_type LIMIT 1) AS n
    )
    SELECT s.* FROM types AS t, LATERAL (
        SELECT {_SUMMARY} FROM {{instance}} WHERE saga_type = t.saga_type AND saga_id = %s
         LIMIT 1) AS s
     ORDER BY s.saga_type LIMIT %s
"""
_TIMELINE = """
    SELECT id, at, kind, message_id, message_type, outcome, version, topic, partition, "offset",
           detail, headers, payload, payload_sha256, effects
      FROM {history} WHERE saga_type = %s AND saga_id = %s AND id > %s ORDER BY id LIMIT %s
"""
_DEADLINES = """
    SELECT id::text, name, due_at, dispatched_at, payload FROM {deadline}
     WHERE saga_type = %s AND saga_id = %s ORDER BY due_at, name
"""
_HELD = f"""
    SELECT id, headers->>'{HEADER_MESSAGE_ID}', headers->>'{HEADER_MESSAGE_TYPE}', topic,
           partition, "offset", reason, created_at
      FROM {{parked}} WHERE saga_type = %s AND saga_id = %s ORDER BY id
"""
_FAILED = f"""
    SELECT id, headers->>'{HEADER_MESSAGE_ID}', topic, reason, attempts, held_behind, failed_at
      FROM {{failed_outbox}} WHERE saga_type = %s AND saga_id = %s ORDER BY id
"""
# Age order from the (saga_type, status, updated_at) index, the one index of the saga table in
# age order (every other would cost each saga write an entry, migration 15): the (type, status)
# pairs by a skip scan (as in _OVERVIEW; pairs are few), then each pair's oldest rows that pass
# the filters, at most a page of them, merged. The statement is built with only the filters
# given (a catch-all `%s IS NULL OR ...` would keep the planner off the index). The cursor is
# the last row's (updated_at, saga_type, saga_id); its first column, repeated alone, bounds each
# pair's walk of the index.
_LIST = f"""
    WITH RECURSIVE pairs AS (
        (SELECT saga_type, status FROM {{instance}} ORDER BY saga_type, status LIMIT 1)
        UNION ALL
        SELECT n.saga_type, n.status FROM pairs AS p, LATERAL (
            SELECT saga_type, status FROM {{instance}}
             WHERE (saga_type, status) > (p.saga_type, p.status)
             ORDER BY saga_type, status LIMIT 1) AS n
    )
    SELECT s.* FROM pairs AS p CROSS JOIN LATERAL (
        SELECT {_SUMMARY} FROM {{instance}}
         WHERE saga_type = p.saga_type AND status = p.status{{where}}
         ORDER BY updated_at, saga_id LIMIT %(limit)s) AS s
     ORDER BY s.updated_at, s.saga_type, s.saga_id LIMIT %(limit)s
"""
_LIST_FILTERS = {
    "type": "saga_type = %(type)s",
    "status": "status = %(status)s",
    "state": "machine_state = %(state)s",
    "older": "updated_at <= now() - %(older)s::interval",
    "after_at": "updated_at >= %(after_at)s"
    " AND (updated_at, saga_type, saga_id) > (%(after_at)s, %(after_type)s, %(after_id)s)",
    # How an ended saga ended is kept in machine_state (see SagaOutcome).
    "outcome": "status = 'ended' AND machine_state = %(outcome)s",
}
# A correlation id is a header of the history's rows. The sagas of one are few, so they are
# looked up first, in migration 14's index of the events that started sagas, and each one's row
# then by its key (LATERAL with LIMIT 1 keeps that a probe per saga). As a semi-join, the
# planner walks the age index and probes the history for every saga, hoping to meet 50 early.
_LIST_BY_CORRELATION = f"""
    SELECT s.* FROM (
        SELECT DISTINCT saga_type, saga_id FROM {{history}}
         WHERE kind = 'event' AND outcome = 'applied' AND version = 1
           AND headers->>'{HEADER_CORRELATION_ID}' = %(correlation)s) AS c
     CROSS JOIN LATERAL (
        SELECT {_SUMMARY} FROM {{instance}}
         WHERE saga_type = c.saga_type AND saga_id = c.saga_id{{where}} LIMIT 1) AS s
     ORDER BY s.updated_at, s.saga_type, s.saga_id LIMIT %(limit)s
"""


def list_statement(params: dict[str, Any], state_contains: Sequence[Mapping[str, Any]] = ()) -> str:
    """The sagas list's statement (still to be rendered) for the filters set in ``params``.

    Only the filters given are in it: a catch-all ``%s IS NULL OR ...`` keeps the planner off
    the indexes. ``state_contains`` adds a condition that the state contains one of the
    documents, each as a parameter ``doc<n>`` added to ``params``.
    """
    where = [sql for key, sql in _LIST_FILTERS.items() if params.get(key) is not None]
    if state_contains:
        docs = []
        for n, doc in enumerate(state_contains):
            params[f"doc{n}"] = json.dumps(doc)
            docs.append(f"state @> %(doc{n})s::jsonb")
        where.append("(" + " OR ".join(docs) + ")")
    extra = "".join(" AND " + w for w in where)
    # `{where}` is the statement's own slot; the table slots stay for `Tables.render`.
    if params.get("correlation") is not None:
        return _LIST_BY_CORRELATION.replace("{where}", extra)
    return _LIST.replace("{where}", extra)


# Stalest first by time in the current machine state (or since the last change, for sagas
# that are not machines): the expression index over unfinished sagas serves the order.
_STUCK = f"""
    SELECT {_SUMMARY} FROM {{instance}}
     WHERE status <> 'ended'
       AND coalesce(machine_state_since, updated_at) <= now() - %(older)s::interval
       AND (%(type)s::text IS NULL OR saga_type = %(type)s::text)
     ORDER BY coalesce(machine_state_since, updated_at) LIMIT %(limit)s
"""
# The (type, status) pairs by a skip scan of the (saga_type, status, updated_at) index, then per
# pair a count that stops at the cap and the oldest row: index work bounded by the cap, not by
# the number of sagas (a plain GROUP BY reads every row).
_OVERVIEW = """
    WITH RECURSIVE pairs AS (
        (SELECT saga_type, status FROM {instance} ORDER BY saga_type, status LIMIT 1)
        UNION ALL
        SELECT n.saga_type, n.status FROM pairs AS p, LATERAL (
            SELECT saga_type, status FROM {instance}
             WHERE (saga_type, status) > (p.saga_type, p.status)
             ORDER BY saga_type, status LIMIT 1) AS n
    )
    SELECT p.saga_type, p.status,
           (SELECT count(*) FROM (SELECT 1 FROM {instance} AS i
             WHERE i.saga_type = p.saga_type AND i.status = p.status LIMIT %(cap)s) AS c),
           now() - (SELECT min(updated_at) FROM {instance} AS i
                     WHERE i.saga_type = p.saga_type AND i.status = p.status)
      FROM pairs AS p ORDER BY p.saga_type, p.status
"""
_COUNTS = """
    SELECT (SELECT count(*) FROM (SELECT 1 FROM {outbox} LIMIT %(cap)s) AS x),
           (SELECT count(*) FROM (SELECT 1 FROM {failed_outbox} LIMIT %(cap)s) AS x),
           (SELECT count(*) FROM (SELECT 1 FROM {deadline}
             WHERE due_at <= now() AND dispatched_at IS NULL LIMIT %(cap)s) AS x),
           (SELECT count(*) FROM (SELECT 1 FROM {dead_letter} LIMIT %(cap)s) AS x),
           (SELECT count(*) FROM (SELECT 1 FROM {instance}
             WHERE status = 'parked' LIMIT %(cap)s) AS x)
"""
_OFFSETS = """
    SELECT topic, partition, next_offset FROM {offsets} WHERE group_id = %s
"""

_INPUT = """
    SELECT topic, partition FROM {history}
     WHERE saga_type = %s AND saga_id = %s AND kind = 'event' AND topic IS NOT NULL
     ORDER BY id DESC LIMIT 1
"""


_IN_BUCKET = re.compile(r"FROM \{(instance|history)\}( AS (\w+))?(\s+)(WHERE |ORDER BY )")


def in_bucket(text: str) -> str:
    """``text`` with every read of the saga and history tables narrowed to ``%(bucket)s``.

    For tables distributed by bucket: Citus plans a recursive or correlated read over them only
    within one shard, so such a read runs once per bucket and the rows are merged here.
    """

    def narrowed(m: re.Match[str]) -> str:
        alias = f"{m.group(3)}." if m.group(3) else ""
        head = f"FROM {{{m.group(1)}}}{m.group(2) or ''}{m.group(4)}WHERE {alias}bucket = {B}"
        return head + (" AND " if m.group(5) == "WHERE " else " ORDER BY ")

    found, count = _IN_BUCKET.subn(narrowed, text)
    if not count:
        raise AssertionError(f"no saga table read in {text!r}")
    return found


B = "%(bucket)s::int"


class InspectQueries(OwnedConnection):
    """Read-mostly queries over the processor's tables, on one connection the caller owns.

    The connection is expected in autocommit mode; closing this object closes it.
    """

    def __init__(self, conn: Conn, tables: Tables) -> None:
        super().__init__(conn)
        r = tables.render
        self._render = r
        self._audit = AuditSql(conn, tables)
        self._buckets = read_layout(conn, tables.schema)
        # Distributed by bucket: the reads Citus plans only within one shard, per bucket.
        self._find_b = r(
            in_bucket(
                _FIND.replace("saga_id = %s", "saga_id = %(id)s").replace(
                    "LIMIT %s", "LIMIT %(limit)s"
                )
            )
        )
        self._overview_b = r(in_bucket(_OVERVIEW))
        self._purge_delete = r(PURGE[PURGE.index("DELETE") : PURGE.index("), counted")])
        self._sql = {
            name: r(text)
            for name, text in (
                ("saga", _SAGA),
                ("find", _FIND),
                ("timeline", _TIMELINE),
                ("deadlines", _DEADLINES),
                ("held", _HELD),
                ("failed", _FAILED),
                ("stuck", _STUCK),
                ("overview", _OVERVIEW),
                ("counts", _COUNTS),
                ("dead_letters", DEAD_LETTERS),
                ("dead_letter", DEAD_LETTER),
                ("dead_letter_of", DEAD_LETTER_OF),
                ("purge", PURGE),
                ("input", _INPUT),
                ("offsets", _OFFSETS),
            )
        }

    def _all(self, name: str, params: Sequence[Any] | Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return self.conn.execute(self._sql[name], params).fetchall()

    # -- one saga ------------------------------------------------------------------------------

    def saga(self, saga_type: str, saga_id: str) -> tuple[SagaSummary, dict[str, Any] | None]:
        """The saga's row and its state; raises LookupError when there is none."""
        found = self.conn.execute(self._sql["saga"], (saga_type, saga_id)).fetchone()
        if found is None:
            raise LookupError(f"no saga {saga_type} {saga_id}")
        return SagaSummary(*found[:-1]), found[-1]

    def timeline(
        self, saga_type: str, saga_id: str, after: int = 0, limit: int = 1000
    ) -> list[TimelineEntry]:
        """History rows in the order they were written, after row id ``after``."""
        return [
            _timeline_entry(row)
            for row in self._all("timeline", (saga_type, saga_id, after, limit))
        ]

    def deadlines(self, saga_type: str, saga_id: str) -> list[PendingDeadline]:
        """Deadlines still scheduled, soonest first."""
        return [PendingDeadline(*r) for r in self._all("deadlines", (saga_type, saga_id))]

    def held(self, saga_type: str, saga_id: str) -> list[HeldRow]:
        """Messages parked behind the saga, in arrival order."""
        return [HeldRow(*r) for r in self._all("held", (saga_type, saga_id))]

    def failed(self, saga_type: str, saga_id: str) -> list[FailedRow]:
        """The saga's failed (and held) outbox rows, in order."""
        return [FailedRow(*r) for r in self._all("failed", (saga_type, saga_id))]

    def input_partition(self, saga_type: str, saga_id: str) -> tuple[str, int] | None:
        """The topic and partition of the saga's latest event: where its input arrives."""
        found = self.conn.execute(self._sql["input"], (saga_type, saga_id)).fetchone()
        return (str(found[0]), int(found[1])) if found is not None else None

    # -- many sagas ----------------------------------------------------------------------------

    def find(self, saga_id: str, limit: int = 50) -> list[SagaSummary]:
        """Sagas of any type with this id."""
        if self._buckets is not None:
            params = {"bucket": Int4(self._buckets.of(saga_id)), "id": saga_id, "limit": limit}
            return [SagaSummary(*r) for r in self.conn.execute(self._find_b, params).fetchall()]
        return [SagaSummary(*r) for r in self._all("find", (saga_id, limit))]

    def list_sagas(
        self,
        *,
        saga_type: str | None = None,
        status: str | None = None,
        machine_state: str | None = None,
        older_than: timedelta | None = None,
        after: tuple[datetime, str, str] | None = None,
        limit: int = 50,
        outcome: str | None = None,
        correlation_id: str | None = None,
        state_contains: Sequence[Mapping[str, Any]] = (),
    ) -> list[SagaSummary]:
        """Sagas least recently changed first; ``after`` is the previous page's last row.

        ``outcome`` keeps ended sagas that ended so (a `SagaOutcome` value); ``correlation_id``
        sagas started by an event with that ``correlation-id`` header; ``state_contains``
        sagas whose state contains one of these documents (`processor.ops._filters`).
        """
        params: dict[str, Any] = {
            "type": saga_type,
            "status": status,
            "state": machine_state,
            "older": older_than,
            "after_at": after[0] if after else None,
            "after_type": after[1] if after else None,
            "after_id": after[2] if after else None,
            "outcome": outcome,
            "correlation": correlation_id,
            "limit": limit,
        }
        text = list_statement(params, state_contains)
        if self._buckets is not None:
            # Each bucket's first page, merged in the list's order.
            narrowed = self._render(in_bucket(text))
            rows = [
                row
                for key in self._bucket_keys()
                for row in self.conn.execute(narrowed, {**params, "bucket": key}).fetchall()
            ]
            rows.sort(key=lambda r: (r[7], r[0], r[1]))
            return [SagaSummary(*r) for r in rows[:limit]]
        rows = self.conn.execute(self._render(text), params).fetchall()
        return [SagaSummary(*r) for r in rows]

    def _bucket_keys(self) -> list[Int4]:
        assert self._buckets is not None
        return [Int4(self._buckets.key(b)) for b in range(self._buckets.count)]

    def stuck(
        self, *, older_than: timedelta, saga_type: str | None = None, limit: int = 50
    ) -> list[SagaSummary]:
        """Unfinished sagas that stayed in their state longer than ``older_than``, stalest first."""
        params = {"older": older_than, "type": saga_type, "limit": limit}
        return [SagaSummary(*r) for r in self._all("stuck", params)]

    def overview(self, cap: int = 10_000) -> Overview:
        """Counts for the console's front page; a count that reaches ``cap`` stops there."""
        if self._buckets is not None:
            # Each bucket's counts and oldest ages, summed (to the cap) and the oldest kept.
            merged: dict[tuple[str, str], tuple[int, timedelta]] = {}
            for key in self._bucket_keys():
                found = self.conn.execute(self._overview_b, {"cap": cap, "bucket": key})
                for t, s, n, age in found.fetchall():
                    count, oldest = merged.get((t, s), (0, age))
                    merged[(t, s)] = (min(cap, count + int(n)), max(age, oldest))
            sagas = [TypeStatusCount(t, s, n, age) for (t, s), (n, age) in sorted(merged.items())]
        else:
            sagas = [
                TypeStatusCount(t, s, int(n), age)
                for t, s, n, age in self._all("overview", {"cap": cap})
            ]
        counts = self.conn.execute(self._sql["counts"], {"cap": cap}).fetchone()
        assert counts is not None
        outbox, failed, overdue, dead, parked = (int(c) for c in counts)
        return Overview(sagas, outbox, failed, overdue, dead, parked, cap)

    def stored_offsets(self, group_id: str) -> dict[tuple[str, int], int | None]:
        """The consumer group's stored positions: the next offset of each partition it owns."""
        return {
            (str(t), int(p)): int(n) if n is not None else None
            for t, p, n in self._all("offsets", (group_id,))
        }

    # -- dead letters --------------------------------------------------------------------------

    def dead_letters(
        self, *, before: int | None = None, reason: str | None = None, limit: int = 50
    ) -> list[DeadLetterRow]:
        """Dead letters newest first; ``before`` is the previous page's last id."""
        params = {"before": before, "reason": reason, "limit": limit}
        return [DeadLetterRow(*r) for r in self._all("dead_letters", params)]

    def dead_letter(self, row_id: int) -> tuple[DeadLetterRow, bytes | None, bytes | None]:
        """One dead letter with its key, value and headers; raises LookupError if missing."""
        found = self.conn.execute(self._sql["dead_letter"], (row_id,)).fetchone()
        if found is None:
            raise LookupError(f"no dead letter {row_id}")
        key = bytes(found[9]) if found[9] is not None else None
        value = bytes(found[10]) if found[10] is not None else None
        row = DeadLetterRow(*found[:9])
        full = dataclasses.replace(
            row, key=payload_text(key), value=payload_text(value), headers=found[11]
        )
        return full, key, value

    def dead_letter_of(self, message_id: str, within: timedelta) -> DeadLetterRow | None:
        """The dead letter of the record with this message id, written ``within`` ago at most."""
        params = {"message_id": message_id, "within": within}
        found = self.conn.execute(self._sql["dead_letter_of"], params).fetchone()
        return DeadLetterRow(*found) if found is not None else None

    def purge_dead_letters(
        self,
        ids: Sequence[int] | None = None,
        older_than: timedelta | None = None,
        audit: AuditEntry | None = None,
    ) -> int:
        """Deletes the selected dead letters; returns how many.

        ``audit``, when given, is recorded with them (the count and ids added to its target),
        unless none was selected.
        """
        params = {
            "ids": ids,
            "older": older_than,
            "cap": AUDIT_IDS,
            "audit": encode_entries([audit] if audit is not None else []),
        }
        if self._buckets is not None:
            return self._purge_by_steps(params, audit)
        found = self.conn.execute(self._sql["purge"], params).fetchone()
        return int(found[0]) if found is not None else 0

    def _purge_by_steps(self, params: dict[str, Any], audit: AuditEntry | None) -> int:
        """:meth:`purge_dead_letters` as a delete, then its audit entry.

        Citus runs a data-modifying CTE only within one shard; dead letters live in every one.
        """
        with self.conn.transaction():
            gone = sorted(
                int(r[0]) for r in self.conn.execute(self._purge_delete, params).fetchall()
            )
            if gone and audit is not None:
                target = {**audit.target, "count": len(gone), "ids": gone[:AUDIT_IDS]}
                self._audit.insert([dataclasses.replace(audit, target=target)])
        return len(gone)

    # -- the audit trail -----------------------------------------------------------------------

    def record_audit(self, entry: AuditEntry) -> None:
        """Records one operator action on its own."""
        self._audit.insert([entry])

    def audit(self, **filters: Unpack[AuditFilters]) -> list[AuditRow]:
        """Operator actions newest first, narrowed by the filters given."""
        return self._audit.entries(**filters)

    def batch_audit(self, batch: str, sagas: Sequence[tuple[str, str]]) -> list[AuditRow]:
        """The entries of ``batch`` recorded for any of ``sagas`` (type, id) so far."""
        return self._audit.batch_entries(batch, sagas)


def _timeline_entry(row: tuple[Any, ...]) -> TimelineEntry:
    (hid, at, kind, mid, mtype, outcome, version, topic, part, offset, detail) = row[:11]
    headers, payload, digest, effects = row[11:]
    return TimelineEntry(
        id=hid,
        at=at,
        kind=kind,
        message_id=mid,
        message_type=mtype,
        outcome=outcome,
        version=version,
        topic=topic,
        partition=part,
        offset=offset,
        detail=detail,
        headers=headers,
        payload=payload_text(bytes(payload)) if payload is not None else None,
        payload_sha256=bytes(digest).hex() if digest is not None else None,
        effects=effects,
    )


def open_inspect_queries(url: str, tables: Tables) -> InspectQueries:
    """Inspect queries on a new autocommit connection of their own."""
    return InspectQueries(
        connect(url, application_name="saga-processor-console", autocommit=True), tables
    )
