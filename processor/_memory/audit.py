"""The operators' audit trail in memory, read as the PostgreSQL one is (`audit list`, `show`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Unpack

from processor._authoring.choices import known_keywords
from processor._engine.rows import AuditEntry
from processor._ports.views import AUDIT_LIMIT, AuditFilters, AuditRow

__all__ = ["MemoryAuditLog"]


class MemoryAuditLog:
    """Audit entries with increasing ids, stamped with the clock as they are recorded.

    Args:
        clock: The time an entry is recorded at (the database's now() in PostgreSQL).
    """

    def __init__(self, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.clock = clock
        self.rows: list[AuditRow] = []
        self._lock = threading.Lock()

    def record(self, entries: Iterable[AuditEntry], at: datetime | None = None) -> None:
        """Stores the entries, in order, with one time: ``at`` (their transaction's), else now."""
        with self._lock:
            at = at if at is not None else self.clock()
            for e in entries:
                self.rows.append(
                    AuditRow(
                        len(self.rows) + 1,
                        at,
                        e.actor,
                        e.action,
                        e.reason,
                        e.saga_type,
                        e.saga_id,
                        dict(e.target),
                        e.outcome,
                    )
                )

    def audit(self, **filters: Unpack[AuditFilters]) -> list[AuditRow]:
        """Entries newest first, narrowed by the filters given."""
        known_keywords(filters, AuditFilters)
        since = filters.get("since")
        oldest = self.clock() - since if since is not None else None
        saga_type, saga_id = filters.get("saga_type"), filters.get("saga_id")
        action, batch = filters.get("action"), filters.get("batch")
        with self._lock:
            picked = [
                r
                for r in self.rows
                if (saga_type is None or r.saga_type == saga_type)
                and (saga_id is None or r.saga_id == saga_id)
                and (action is None or r.action == action)
                and (oldest is None or r.at >= oldest)
                and (batch is None or r.target.get("batch") == batch)
            ]
        newest = sorted(picked, key=lambda r: (r.at, r.id), reverse=True)
        return newest[: filters.get("limit", AUDIT_LIMIT)]
