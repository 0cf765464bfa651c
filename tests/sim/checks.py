"""The invariants of a simulated run: as it goes, once it has healed, and at its end."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from processor._engine.rows import Outcome
from processor._ports import TP
from tests.sim.model import COMMANDS, SAGA_TYPE

if TYPE_CHECKING:
    from tests.sim.run import Result
    from tests.sim.world import World

__all__ = ["END_CHECKS", "Checks"]

# What a run checks once it has healed (besides "settled": no saga stuck, nothing in doubt).
END_CHECKS = (
    "each-input-decided-once",
    "no-dead-letters",
    "all-ended",
    "steps-in-order-once",
    "commands-published-as-committed",
    "commands-in-commit-order",
    "batches-taken-as-committed-once",
    "deadline-applied-once-on-its-partition",
)


class Checks:
    """Checks one world; ``sagas`` is how many sagas its run publishes."""

    def __init__(self, world: World, sagas: int) -> None:
        self.world = world
        self.sagas = sagas
        # The stored offsets as last seen: they may only move forward.
        self._offsets: dict[TP, int] = {}

    def where_stuck(self) -> list[str]:
        w = self.world
        out = []
        offsets = w.offsets()
        for tp in w.broker.input_partitions():
            owner = w.group.owner.get(tp)
            member = w.group.members.get(owner) if owner else None
            state = "no owner"
            if member is not None:
                owned = member.worker._ownership.owned.get(tp)
                paused = tp in member.client._paused
                state = f"{owner}: {owned or 'not claimed'}{', paused' if paused else ''}"
                stored = w.db.tables.offsets.get(tp, (None, None))[0]
                if owned is not None and owned.epoch != stored:
                    state += f", but the store's epoch is {stored}"
            out.append(
                f"  {tp}: stored {offsets.get(tp)}, end {len(w.broker.logs[tp])}, group: {state}"
            )
        started = {sid for (_, sid) in w.db.tables.sagas}
        never = [f"s{i}" for i in range(self.sagas) if f"s{i}" not in started]
        if never:
            out.append(f"  never started: {never}")
        for (_, sid), row in w.db.tables.sagas.items():
            if row.status != "ended" and isinstance(row.state, dict):
                done, steps = row.state.get("done"), row.state.get("steps")
                out.append(f"  {sid} {row.status}: done {done} of {steps}")
        if w.db.outbox.pending():
            out.append(f"  {len(w.db.outbox.pending())} outbox rows unpublished")
        for r in w.live():
            rec = r.worker._recovery
            if rec.detached or rec.unsynced or rec._doubt is not None:
                out.append(
                    f"  {r.name}: detached {rec.detached}, unsynced {rec.unsynced}, "
                    f"batch in doubt {rec._doubt is not None}"
                )
        return out

    def settled(self) -> bool:
        w = self.world
        t = w.db.tables
        ended = [k for k, row in t.sagas.items() if row.status == "ended"]
        if len(ended) < self.sagas:
            return False
        if w.db.outbox.pending():
            return False
        for r in w.live():
            if r.worker._pending is not None:
                return False  # a batch it has not seen the end of, committed or not
            # Every replica back at work: none given back, none with a batch still in doubt.
            recovery = r.worker._recovery
            if recovery.detached or recovery.unsynced or recovery._doubt is not None:
                return False
        offsets = w.offsets()
        for tp in w.broker.input_partitions():
            # Each partition's owner in the group holds the claim the store has: one fenced by
            # a claim it never learnt of would sit on the partition, unable to commit there.
            owner = w.group.members.get(w.group.owner.get(tp, ""))
            owned = owner.worker._ownership.owned.get(tp) if owner is not None else None
            if owned is None or owned.epoch != w.db.tables.offsets.get(tp, (None, None))[0]:
                return False
        return all(
            (offsets.get(tp) or 0) == len(w.broker.logs[tp]) for tp in w.broker.input_partitions()
        )

    def as_we_go(self, result: Result) -> None:
        w = self.world
        result.checks.update(("offsets-never-back", "one-writer-per-epoch"))
        for tp, nxt in w.offsets().items():
            if nxt is None:
                continue
            if nxt < self._offsets.get(tp, 0):
                result.failures.append(f"the stored offset of {tp} moved back to {nxt}")
            self._offsets[tp] = nxt
        if w.db.violations:
            result.failures.extend(w.db.violations)
            w.db.violations.clear()

    def at_the_end(self, result: Result) -> None:
        result.checks.update(END_CHECKS)
        f = result.failures
        w = self.world
        t = w.db.tables
        # Every input record below the stored offsets was decided exactly once.
        seen: Counter[tuple[str, int, int]] = Counter(
            (h.topic, h.partition, h.offset) for h in t.history
        )
        for tp in w.broker.input_partitions():
            markers = w.broker.markers.get(tp, set())
            for rec in w.broker.logs[tp]:
                if rec.offset in markers:
                    continue  # a transaction marker: no record any consumer sees
                n = seen[(rec.topic, rec.partition, rec.offset)]
                # A fired deadline whose row is gone (applied already: a second send of the
                # same fire; rescheduled since) is dropped unrecorded; every event is decided.
                fired = dict(rec.headers).get("message-type") == b"saga.deadline-fired"
                if n > 1 or (n == 0 and not fired):
                    f.append(f"record {tp}@{rec.offset} has {n} history rows")
        if t.dead_letters:
            f.append(
                f"{len(t.dead_letters)} valid records dead-lettered: {t.dead_letters[0].reason}"
            )
        parked = [k for k, row in t.sagas.items() if row.status != "ended"]
        if parked:
            f.append(f"sagas not ended: {parked}")
        # Each saga applied its steps in order, exactly once each.
        for (stype, sid), row in t.sagas.items():
            if stype != SAGA_TYPE or not isinstance(row.state, dict):
                continue
            done, steps = row.state.get("done"), row.state.get("steps")
            if done != list(range(1, (steps or 0) + 1)):
                f.append(f"{sid} applied steps {done} of {steps}")
        # Every committed command was published, under its id, with the bytes committed, and
        # each saga's commands went out in the order they were committed.
        sent: dict[str, bytes] = {}
        order: dict[str, list[str]] = {}
        for p in range(w.broker.partitions[COMMANDS]):
            for rec in w.broker.logs[(COMMANDS, p)]:
                h = dict((k, v.decode()) for k, v in rec.headers)
                mid = h["message-id"]
                if sent.setdefault(mid, rec.value or b"") != (rec.value or b""):
                    f.append(f"command {mid} published with different bytes")
                ids = order.setdefault(h.get("saga-id", ""), [])
                if mid not in ids:
                    ids.append(mid)
        committed: dict[str, list[str]] = {}
        for out in w.db.committed:
            if out.topic != COMMANDS:
                continue
            mid = out.headers["message-id"]
            if sent.get(mid) != out.value:
                f.append(f"committed command {mid} of {out.saga_id} never published as committed")
            committed.setdefault(out.saga_id or "", []).append(mid)
        for sid, ids in committed.items():
            if order.get(sid) != ids:
                f.append(
                    f"{sid}'s commands published in the order {order.get(sid)}, committed {ids}"
                )
        # Every batch a replica committed was taken as committed by it, once (its metrics,
        # log lines and wake-ups follow from that); none it did not commit. A crashed
        # replica's memory is gone with it. One whose partitions changed owner before its
        # outcome could be read is said to be unknown, and not counted.
        for r in w.live():
            done = w.db.commits.get(r.name, [])
            seen_ids = Counter(id(ws) for ws in r.reported)
            missed = [ws for ws in done if seen_ids[id(ws)] == 0 and id(ws) not in w.db.late_ws]
            if len(missed) > r.worker.stats.doubts_unresolved:
                f.append(f"a batch {r.name} committed was never taken as committed")
            if any(n > 1 for n in seen_ids.values()):
                f.append(f"a batch {r.name} committed was taken as committed twice")
            committed_ids = {id(ws) for ws in done}
            # A batch whose commit hung, then went through after a later attempt at the same
            # records was planned, leaves the offsets that attempt expects (all of them, or
            # more): the replica takes that one as committed; the records were applied once,
            # by the other.
            late = [set(w.db.tried[id(ws)]) for ws in done if id(ws) in w.db.late_ws]
            for ws in r.reported:
                if id(ws) in committed_ids:
                    continue
                mine = set(w.db.tried.get(id(ws), ()))
                if not any(mine <= other for other in late):
                    f.append(f"{r.name} took a batch as committed that was not")
        # Every fired deadline was applied at most once, on its saga's partition.
        applied = [h for h in t.history if h.kind == "deadline" and h.outcome is Outcome.APPLIED]
        per = Counter((h.saga_id, h.message_id) for h in applied)
        for key, n in per.items():
            if n > 1:
                f.append(f"deadline {key} applied {n} times")
        homes = {h.saga_id: h.partition for h in t.history if h.message_type == "sim.Opened"}
        for fire in applied:
            if homes.get(fire.saga_id) != fire.partition:
                f.append(f"a deadline of {fire.saga_id} fired on partition {fire.partition}")
