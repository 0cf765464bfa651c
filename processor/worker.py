"""The consumer loop: one batch per poll, one transaction per batch, offsets stored with effects."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg

from processor.engine.decode import Event, decode
from processor.engine.plan import Planner, WriteSet
from processor.engine.records import Record
from processor.kafka.client import TP, SagaConsumer
from processor.messages import MessageRegistry
from processor.postgres.store import BatchStore, ConcurrentUpdate, FencedOut, OffsetCommit

log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass
class _Owned:
    epoch: int
    next_offset: int | None


@dataclass
class WorkerStats:
    batches: int = 0
    records: int = 0
    rejected_batches: int = 0
    counts: Counter[str] = field(default_factory=Counter)


class Worker:
    """Drives one consumer. `poll_once()` is the single step; `run()` loops it."""

    def __init__(
        self,
        *,
        store_factory: Callable[[], BatchStore],
        planner: Planner,
        registry: MessageRegistry,
        owner: str,
        max_record_bytes: int,
        batch_size: int,
        batch_timeout: float,
        on_commit: Callable[[WriteSet], None] = lambda ws: None,
    ) -> None:
        self._store_factory = store_factory
        self.store = store_factory()
        self.planner = planner
        self.registry = registry
        self.owner = owner
        self.max_record_bytes = max_record_bytes
        self.batch_size = batch_size
        self.batch_timeout = batch_timeout
        self.on_commit = on_commit
        self.owned: dict[TP, _Owned] = {}
        self.stats = WorkerStats()
        self.consumer: SagaConsumer | None = None
        self._failures = 0
        # Called at named points of a batch ("before-commit", "after-commit"); crash tests
        # install a hook that kills the process there.
        self.fault_hook: Callable[[str], None] = lambda point: None

    # -- rebalance callbacks (run inside consume(), on this thread) --------------------------

    def on_assign(self, tps: list[TP]) -> Mapping[TP, int | None]:
        claimed = self._with_store(lambda s: s.claim(tps, self.owner))
        for tp, (epoch, nxt) in claimed.items():
            self.owned[tp] = _Owned(epoch, nxt)
        log.info("assigned %s", sorted(claimed))
        return {tp: o for tp, (_, o) in claimed.items()}

    def on_revoke(self, tps: list[TP]) -> None:
        for tp in tps:
            self.owned.pop(tp, None)
        log.info("revoked %s", sorted(tps))

    # -- the loop ----------------------------------------------------------------------------

    def poll_once(self) -> int:
        assert self.consumer is not None
        records = self.consumer.consume(self.batch_size, self.batch_timeout)
        if records:
            self.process(records)
        return len(records)

    def process(self, records: list[Record]) -> bool:
        """Applies one batch; returns False when it was rolled back and positions resynced."""
        mine = [
            r
            for r in records
            if (o := self.owned.get((r.topic, r.partition))) is not None
            and (o.next_offset is None or r.offset >= o.next_offset)
        ]
        if not mine:
            return True
        decoded = [decode(r, self.registry, self.max_record_bytes) for r in mine]
        items, wants = self.planner.route(decoded)
        routed = self.planner.event_types  # a fresh set per access: taken once per batch
        unrouted = sum(1 for d in decoded if isinstance(d, Event) and type(d.message) not in routed)
        last: dict[TP, int] = {}
        for r in mine:
            last[(r.topic, r.partition)] = r.offset + 1
        offsets = [
            OffsetCommit(t, p, nxt, self.owned[(t, p)].next_offset, self.owned[(t, p)].epoch)
            for (t, p), nxt in last.items()
        ]
        try:
            with self.store.conn.transaction():
                loaded = self.store.load(wants)
                ws = self.planner.plan(items, loaded, loaded.now, unrouted=unrouted)
                self.store.write(ws, offsets)
                self.fault_hook("before-commit")
        except (FencedOut, ConcurrentUpdate, psycopg.Error) as e:
            self.stats.rejected_batches += 1
            log.warning("batch of %d records not committed (%s); resyncing", len(mine), e)
            self._resync()
            return False
        self.fault_hook("after-commit")
        self._failures = 0
        for tp, nxt in last.items():
            if tp in self.owned:
                self.owned[tp].next_offset = nxt
        self.stats.batches += 1
        self.stats.records += len(mine)
        self.stats.counts.update(ws.counts)
        self.on_commit(ws)
        if self.consumer is not None:
            self.consumer.commit_advisory(last)
        return True

    def _resync(self) -> None:
        """After a failed or in-doubt commit: trust only what Postgres says was committed."""
        self._failures += 1
        if self._failures > 1:
            # Bounded backoff while the database is unreachable; never a hot loop.
            time.sleep(min(5.0, 0.1 * 2 ** min(self._failures, 6)))
        tps = list(self.owned)
        stored = self._with_store(lambda s: s.read_offsets(tps))
        lost = []
        for tp in tps:
            epoch, nxt = stored.get(tp, (None, None))
            if epoch != self.owned[tp].epoch:
                lost.append(tp)
                del self.owned[tp]
                continue
            self.owned[tp].next_offset = nxt
            if self.consumer is not None:
                self.consumer.seek(tp, nxt)
        if lost:
            log.warning("fenced out of %s: another replica owns them now", sorted(lost))
            if self.consumer is not None:
                self.consumer.pause(lost)

    def _with_store(self, fn: Callable[[BatchStore], _T]) -> _T:
        """Runs fn, reconnecting once if the connection broke (e.g. a commit in doubt)."""
        try:
            return fn(self.store)
        except psycopg.OperationalError:
            self._reconnect()
            return fn(self.store)

    def _reconnect(self) -> None:
        try:
            self.store.conn.close()
        finally:
            self.store = self._store_factory()
