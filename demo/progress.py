"""What the demo shows while it runs and at the end, read from the processor's own tables."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from psycopg.rows import TupleRow

from demo.traffic import (
    COMPENSATED,
    COMPLETED,
    FAILED,
    REFUNDED,
    TIMED_OUT,
    TRANSFER_SAGA,
    WALLET_SAGA,
    Request,
)
from processor.publish import with_client_logging as logged


@dataclass
class Snapshot:
    by_status: Counter[tuple[str, str]] = field(default_factory=Counter)
    deadlines_pending: int = 0
    deadlines_fired: int = 0
    dead_letters: int = 0
    outbox: int = 0
    commands_sent: int = 0

    def count(self, saga_type: str, *statuses: str) -> int:
        return sum(n for (t, s), n in self.by_status.items() if t == saga_type and s in statuses)


class Monitor:
    """Reads counts from the processor's schema and the command topics' end offsets."""

    def __init__(
        self,
        database_url: str,
        schema: str,
        kafka: Mapping[str, str],
        command_topics: Sequence[str],
    ) -> None:
        self.conn: psycopg.Connection[TupleRow] = psycopg.connect(
            database_url, autocommit=True, application_name="demo-monitor"
        )
        self.schema = schema
        # Never subscribes: only asks for end offsets, so it joins no group.
        self.kafka = Consumer(logged({**kafka, "group.id": f"{schema}-monitor"}))
        self.command_topics = list(command_topics)
        self._partitions: list[TopicPartition] | None = None

    def _q(self, template: str) -> list[tuple[Any, ...]]:
        return self.conn.execute(template.format(s=f'"{self.schema}"')).fetchall()

    def snapshot(self) -> Snapshot:
        snap = Snapshot()
        for saga_type, status, n in self._q(
            "SELECT saga_type, status, count(*) FROM {s}.saga_instance GROUP BY 1, 2"
        ):
            snap.by_status[(saga_type, status)] = int(n)
        ((pending, fired, dead, outbox),) = self._q(
            "SELECT (SELECT count(*) FROM {s}.saga_deadline),"
            " (SELECT count(*) FROM {s}.saga_history"
            "  WHERE kind = 'deadline' AND outcome = 'applied'),"
            " (SELECT count(*) FROM {s}.dead_letter), (SELECT count(*) FROM {s}.outbox)"
        )
        snap.deadlines_pending, snap.deadlines_fired = int(pending), int(fired)
        snap.dead_letters, snap.outbox = int(dead), int(outbox)
        snap.commands_sent = self._commands_sent()
        return snap

    def _commands_sent(self) -> int:
        if self._partitions is None:
            meta = self.kafka.list_topics(timeout=5)
            self._partitions = [
                TopicPartition(t, p) for t in self.command_topics for p in meta.topics[t].partitions
            ]
        return sum(
            self.kafka.get_watermark_offsets(tp, timeout=5, cached=False)[1]
            for tp in self._partitions
        )

    def outcomes(self) -> dict[str, str]:
        """transfer id -> what became of it, for every ended saga."""
        fired = {
            str(sid)
            for (sid,) in self._q(
                "SELECT saga_id FROM {s}.saga_history "
                "WHERE kind = 'deadline' AND outcome = 'applied'"
            )
        }
        out: dict[str, str] = {}
        for saga_type, saga_id, state, ended in self._q(
            "SELECT saga_type, saga_id, state, machine_state FROM {s}.saga_instance "
            "WHERE status = 'ended'"
        ):
            st = state if isinstance(state, dict) else json.loads(state or "{}")
            if saga_type == TRANSFER_SAGA:
                if st.get("credit_confirmed"):
                    out[saga_id] = COMPLETED
                elif saga_id in fired:
                    out[saga_id] = TIMED_OUT
                else:
                    # The outcome the saga ended with: the debit reversed, or nothing to undo.
                    out[saga_id] = COMPENSATED if ended == "COMPENSATED" else FAILED
            elif saga_type == WALLET_SAGA:
                out[saga_id] = COMPLETED if "completed" in st.get("history", []) else REFUNDED
        return out

    def fired(self) -> list[str]:
        rows = self._q(
            "SELECT saga_id FROM {s}.saga_history WHERE kind = 'deadline' AND outcome = 'applied' "
            "ORDER BY id"
        )
        return [str(r[0]) for r in rows]

    def split(self) -> list[tuple[str, int, int]]:
        """(replica, partitions owned, records consumed): how the replicas shared the work."""
        rows = self._q(
            "SELECT coalesce(owner, '?'), count(*), coalesce(sum(next_offset), 0) "
            "FROM {s}.consumer_offset GROUP BY 1 ORDER BY 1"
        )
        return [(str(o), int(n), int(r)) for o, n, r in rows]

    def close(self) -> None:
        self.kafka.close()
        self.conn.close()


def line(snap: Snapshot, elapsed: float, expected: Mapping[str, int]) -> str:
    """One compact progress line."""
    parts = []
    for saga_type, total in expected.items():
        ended = snap.count(saga_type, "ended")
        active = snap.count(saga_type, "active")
        parked = snap.count(saga_type, "parked")
        text = f"{saga_type} {ended}/{total} ended, {active} active"
        parts.append(text + (f", {parked} PARKED" if parked else ""))
    parts.append(f"commands {snap.commands_sent}")
    parts.append(f"deadlines {snap.deadlines_pending} pending/{snap.deadlines_fired} fired")
    parts.append(f"dead letters {snap.dead_letters}")
    return f"[{elapsed:5.1f}s] " + " | ".join(parts)


_SHOWN = (COMPLETED, COMPENSATED, FAILED, REFUNDED, TIMED_OUT)


def summary(
    requests: Sequence[Request], outcomes: Mapping[str, str], fired: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Lines per saga type and the requests that ended otherwise than planned."""
    lines: list[str] = []
    for saga_type in (TRANSFER_SAGA, WALLET_SAGA):
        ids = [r.transfer_id for r in requests if r.saga_type == saga_type]
        got = Counter(outcomes.get(i, "not ended") for i in ids)
        counts = ", ".join(f"{k} {got[k]}" for k in _SHOWN if got[k])
        rest = ", ".join(f"{k} {n}" for k, n in got.items() if k not in _SHOWN)
        lines.append(
            f"  {saga_type:<16} {len(ids):3d} sagas: {counts}{', ' + rest if rest else ''}"
        )
    lines.append(f"  timeouts fired: {len(fired)} ({', '.join(fired) or 'none'})")
    surprises = [
        f"  {r.transfer_id} ({r.why}): expected {r.expect}, "
        f"got {outcomes.get(r.transfer_id, 'not ended')}"
        for r in requests
        if outcomes.get(r.transfer_id) != r.expect
    ]
    return lines, surprises
