"""One simulated run from a seed: the schedule, the faults, the invariants, the trace hash.

A run draws every decision from one ``random.Random(seed)``: which loop steps next, when time
moves and by how much, which fault comes and where. Faults are numbered as they are drawn;
``disabled`` skips some of them (the choice of each fault is still drawn, its own details are
not, so what follows may change). Shrinking leaves a fault out for good only when the run
without it still fails, so what it keeps is a failing schedule with fewer faults.

After the scheduled steps the world heals (faults off, frozen replicas back, one replica at
least) and runs until every saga ended, the outbox is empty and every offset is at its log's
end; a world that cannot get there within its bound is a failure too (a stuck saga).
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from processor._errors import DeliveryFailed, Retryable
from processor._runtime.consumer import access
from processor._runtime.poller import _fired
from tests.sim.bugs import switched
from tests.sim.checks import Checks
from tests.sim.lanes import SimLane
from tests.sim.model import COMMANDS, Opened
from tests.sim.world import Replica, World, publish

__all__ = ["FAULTS", "Result", "describe", "replay_command", "run", "shrink"]

STEPS = 120
SAGAS = 6
HEAL_ROUNDS = 400

# Relative weights of the scheduler's choices; the faults share FAULTS' weight.
WORK = {"publish": 3, "step": 8, "commit": 3, "relay": 4, "poll": 2, "participant": 4, "tick": 2}
FAULTS = {
    "crash": 2,
    "join": 2,
    "freeze": 2,
    "thaw": 3,
    "db-refuse": 2,
    "db-in-doubt": 3,
    "db-down": 2,
    "db-stall": 2,
    "late-commit": 2,
    "poller-pause": 2,
    "poller-wake": 2,
    "produce-refuse": 1,
    "seek-refuse": 2,
    "produce-lost-ack": 2,
    "lose-reply": 2,
    "dup-reply": 1,
    "dup-record": 2,
    "txn-marker": 2,
    "clock-jump": 1,
}
FAULT_SHARE = 0.25
MAX_REPLICAS = 4


@dataclass
class Result:
    """What a run did and found.

    Attributes:
        seed: The seed.
        trace: The hash of every decision and what it led to: equal for equal runs.
        failures: The invariants that did not hold, and how the run stopped if it did not end.
        faults: Faults injected, by kind.
        steps: Decisions taken.
        last: The last decisions, for the report.
        checks: Invariants evaluated, by name.
        scheduled: The last scheduled decisions, before the world healed.
        bugs: The fixed bugs put back for the run.
        disabled: The faults left out (by number), when shrunk.
        drawn: Faults drawn, numbered 1.. (those left out and those not applicable included).
    """

    seed: int
    trace: str = ""
    failures: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    steps: int = 0
    last: list[str] = field(default_factory=list)
    checks: Counter[str] = field(default_factory=Counter)
    scheduled: list[str] = field(default_factory=list)
    bugs: list[str] = field(default_factory=list)
    disabled: list[int] = field(default_factory=list)
    drawn: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures


class _Run:
    def __init__(self, seed: int, disabled: frozenset[int], steps: int, bugs: Iterable[str]):
        self.seed = seed
        self.rng = random.Random(seed)
        self.disabled = disabled
        self.steps = steps
        self.world = World(self.rng)
        self.result = Result(seed, bugs=sorted(bugs), disabled=sorted(disabled))
        self._hash = hashlib.sha256(f"seed {seed}".encode())
        self._fault_no = 0
        self._published = 0
        self._sagas = self.rng.randint(2, SAGAS)
        self.checks = Checks(self.world, self._sagas)
        self._lose = 0
        self._dup = 0
        self._bugs = set(bugs)

    # -- the schedule ------------------------------------------------------------------------

    def go(self) -> Result:
        w = self.world
        for _ in range(self.rng.randint(1, 3)):
            self._join()
        try:
            for _ in range(self.steps):
                self._decide()
                self.checks.as_we_go(self.result)
                if self.result.failures:
                    return self._done()
            self.result.scheduled = list(self.result.last)
            self._heal()
            if not self.result.failures:
                self.checks.at_the_end(self.result)
        except Exception as e:  # a loop that raised is a finding, not a crash of the run
            self.result.failures.append(f"{type(e).__name__}: {e}")
        finally:
            for r in w.live():
                r.worker._lanes.close()
        return self._done()

    def _done(self) -> Result:
        self.result.drawn = self._fault_no
        self.result.trace = self._hash.hexdigest()[:16]
        return self.result

    def _note(self, what: str) -> None:
        self.result.steps += 1
        self.result.last = [*self.result.last[-19:], what]
        t = self.world.db.tables
        digest = (
            what,
            len(t.history),
            len(self.world.db.committed),
            sorted(self.world.offsets().items()),
        )
        self._hash.update(repr(digest).encode())

    def _pick(self, weights: dict[str, int]) -> str:
        names = list(weights)
        return self.rng.choices(names, weights=[weights[n] for n in names])[0]

    def _replica(self, runnable: bool = True) -> Replica | None:
        found = [r for r in self.world.live() if not (runnable and r.frozen)]
        return self.rng.choice(found) if found else None

    def _decide(self) -> None:
        if self.rng.random() < FAULT_SHARE:
            kind = self._pick(FAULTS)
            self._fault_no += 1
            if self._fault_no in self.disabled:
                self._note(f"fault #{self._fault_no} {kind} (disabled)")
                return
            done = self._fault(kind)
            if done:
                self.result.faults[kind] += 1
            self._note(f"fault #{self._fault_no} {kind}: {done or 'not applicable'}")
            return
        self._work(self._pick(WORK))

    def _work(self, kind: str) -> None:
        w = self.world
        if kind == "publish":
            if self._published >= self._sagas:
                kind = "tick"
            else:
                sid = f"s{self._published}"
                self._published += 1
                steps = self.rng.randint(1, 4)
                publish(w.broker, Opened(sim_id=sid, steps=steps), f"open-{sid}", sid)
                self._note(f"publish {sid} ({steps} steps)")
                return
        if kind == "tick":
            delta = self.rng.choice([0.5, 2.0, 10.0, 31.0, 65.0])
            w.clock.now += delta
            self._note(f"tick +{delta}s")
            return
        if kind == "participant":
            n = w.participant.step(self._lose_one, self._dup_one)
            self._note(f"participant read {n}")
            return
        r = self._replica()
        if r is None:
            self._note(f"{kind}: no replica")
            return
        if kind == "commit":
            # The batch a replica handed to its write lane commits before its next poll.
            writes = [f for f in r.writes() if not f.stalled]
            if not writes:
                self._note(f"{r.name} commit: none in flight")
                return
            writes[0].run()
            self._note(f"{r.name} committed its batch in flight")
        elif kind == "step":
            self._step(r, settle=self.rng.random() < 0.5)
        elif kind == "relay":
            self._relay(r)
        elif kind == "poll":
            self._poll(r)

    def _relay(self, r: Replica) -> None:
        # What Relay.run does with a round's failure: count it, back off, go on.
        try:
            n = r.relay.run_once()
        except (Retryable, DeliveryFailed) as e:
            self._note(f"{r.name} relay round failed: {type(e).__name__}")
            return
        self._note(f"{r.name} relay published {n}")

    def _wake_poller(self, index: int = 0) -> str | None:
        r, token, rows = self.world.paused_sends.pop(index)
        if not r.alive:
            return None
        failures = r.poller.producer.send([_fired(d, token) for d in rows], 10.0)
        if failures:
            # As a sweep does: what was not acknowledged is due again.
            self.world.db.deadlines.unclaim([rows[f.index].id for f in failures], token)
        return f"{r.name}'s poller woke and sent {len(rows) - len(failures)} fired records late"

    def _poll(self, r: Replica) -> None:
        if any(p is r for p, _, _ in self.world.paused_sends):
            self._note(f"{r.name} poller paused")
            return
        # What DeadlinePoller.run does with a transient failure: drop the token, go on.
        try:
            r.poller.step()
        except Retryable as e:
            r.poller.token = None
            self._note(f"{r.name} poller failed: {type(e).__name__}")
            return
        finally:
            self.world.db.sync_lease()
        self._note(f"{r.name} poller token {r.poller.token}")

    def _step(self, r: Replica, settle: bool = True) -> None:
        # Without a settle, the batch just planned stays on the write lane: the next poll
        # plans the one after over it, as the worker's pipeline does.
        n = r.worker.poll_once()
        if settle:
            r.worker.settle()
        self._note(f"{r.name} step read {n}{'' if settle else ', its batch in flight'}")

    def _lose_one(self) -> bool:
        if self._lose:
            self._lose -= 1
            return True
        return False

    def _dup_one(self) -> bool:
        if self._dup:
            self._dup -= 1
            return True
        return False

    def _join(self) -> str:
        r = self.world.start_replica(self.rng.choice([1, 3, 10, 50]))
        return f"{r.name} joined"

    def _fault(self, kind: str) -> str | None:
        w = self.world
        rng = self.rng
        if kind == "join":
            return self._join() if len(w.live()) < MAX_REPLICAS else None
        if kind == "crash":
            r = self._replica(runnable=False)
            if r is None or len(w.live()) < 2:
                return None
            committed = 0
            for write in r.writes():
                # Its batch in flight committed just before the crash, or never reached the
                # database.
                if not write.stalled and rng.random() < 0.5:
                    write.run()
                    committed += 1
            r.crash()
            after = " after its batch in flight committed" if committed else ""
            return f"{r.name} crashed{after}"
        if kind == "freeze":
            r = self._replica()
            if r is None or len(w.live()) < 2:
                return None
            r.frozen = True
            # Frozen past its session: the group moves its partitions without telling it.
            w.group.expel(r.name)
            return f"{r.name} frozen past its session"
        if kind == "thaw":
            frozen = [r for r in w.live() if r.frozen]
            if not frozen:
                return None
            r = rng.choice(frozen)
            self._thaw(r)
            return f"{r.name} woke as a zombie"
        if kind in ("db-refuse", "db-in-doubt"):
            r = self._replica(runnable=False)
            if r is None:
                return None
            w.faults.writes[r.name].append(kind.removeprefix("db-"))
            return f"{r.name}'s next commit: {kind}"
        if kind == "db-down":
            r = self._replica(runnable=False)
            if r is None:
                return None
            span = rng.choice([3.0, 15.0, 45.0])
            w.faults.down_until[r.name] = w.clock.now + span
            return f"database away from {r.name} for {span}s"
        if kind in ("produce-refuse", "produce-lost-ack"):
            r = self._replica(runnable=False)
            if r is None:
                return None
            who = f"{r.name}:{rng.choice(['relay', 'poller'])}"
            w.faults.produce[who].append(kind.removeprefix("produce-"))
            return f"{who}'s next send: {kind}"
        if kind == "db-stall":
            found = [r for r in w.live() if r.writes() and not r.writes()[0].stalled]
            if not found:
                return None
            r = rng.choice(found)
            hung = r.writes()[0]
            hung.stalled = True
            w.hung.append(hung)
            return f"{r.name}'s commit in flight hangs"
        if kind == "late-commit":
            if not w.hung:
                return None
            hung = w.hung.pop(rng.randrange(len(w.hung)))
            if rng.random() < 0.5:
                return "a hung commit's connection died: rolled back"
            w.db.late_run = True
            try:
                hung.run()
            finally:
                w.db.late_run = False
            return "a hung commit went through after all"
        if kind == "poller-pause":
            # The leader claims its due deadlines, then pauses past its lease before it sends
            # their fired records: a new leader fires them again meanwhile.
            r = self._replica()
            if r is None or r.poller.token is None or any(p is r for p, _, _ in w.paused_sends):
                return None
            token = r.poller.token
            rows, _ = w.db.deadlines.claim_due(r.name, token, 100, full=False)
            w.db.sync_lease()
            if not rows:
                return None
            w.paused_sends.append((r, token, rows))
            w.clock.now += r.poller.settings.lease_ttl.total_seconds() + 1.0
            return f"{r.name}'s poller paused past its lease with {len(rows)} claimed"
        if kind == "poller-wake":
            if not w.paused_sends:
                return None
            return self._wake_poller(rng.randrange(len(w.paused_sends)))
        if kind == "seek-refuse":
            r = self._replica(runnable=False)
            if r is None:
                return None
            w.faults.seeks[r.name] += 1
            return f"{r.name}'s next seek is refused"
        if kind == "lose-reply":
            self._lose += 1
            return "the participant's next reply is lost"
        if kind == "dup-reply":
            self._dup += 1
            return "the participant's next reply is sent twice"
        if kind == "dup-record":
            inputs = [
                rec
                for tp in w.broker.input_partitions()
                for rec in w.broker.logs[tp]
                if rec.offset not in w.broker.markers.get(tp, set())
            ]
            if not inputs:
                return None
            rec = rng.choice(inputs)
            w.broker.append(rec.topic, rec.key, rec.value, rec.headers, rec.partition)
            return f"record {rec.topic}/{rec.partition}@{rec.offset} delivered again"
        if kind == "txn-marker":
            # A transactional producer's commit or abort marker takes an offset no record
            # has: a partition can end with markers, which its stored position must pass.
            tp = rng.choice(w.broker.input_partitions())
            marker = w.broker.append(tp[0], None, None, (), tp[1])
            w.broker.markers.setdefault(tp, set()).add(marker.offset)
            return f"a transaction marker at {tp[0]}/{tp[1]}@{marker.offset}"
        if kind == "clock-jump":
            r = self._replica(runnable=False)
            if r is None:
                return None
            jump = rng.choice([-40.0, -5.0, 5.0, 90.0])
            r.skew += jump
            return f"{r.name}'s clock jumped {jump:+}s"
        return None

    def _thaw(self, r: Replica) -> None:
        # Its first poll after the pause acts as the owner until the client hands it the
        # loss of its partitions: what it writes before must be fenced.
        r.frozen = False
        self._step(r)

    # -- healing and the end -------------------------------------------------------------------

    def _heal(self) -> None:
        w = self.world
        w.faults.writes.clear()
        w.faults.produce.clear()
        w.faults.down_until.clear()
        self._lose = self._dup = 0
        for r in w.live():
            if r.frozen:
                self._thaw(r)
        while w.paused_sends:
            self._wake_poller()
        if not w.live():
            self._join()
        while self._published < self._sagas:
            self._work("publish")
        for round_no in range(HEAL_ROUNDS):
            if self.checks.settled():
                self._note(f"settled after {round_no} rounds")
                return
            before = (
                len(w.db.tables.history),
                len(w.db.committed),
                len(w.broker.logs[(COMMANDS, 0)]),
            )
            for r in w.live():
                self._step(r)
                self._step(r)
                self._relay(r)
                self._poll(r)
            w.participant.step(lambda: False, lambda: False)
            self.checks.as_we_go(self.result)
            if self.result.failures:
                return
            after = (
                len(w.db.tables.history),
                len(w.db.committed),
                len(w.broker.logs[(COMMANDS, 0)]),
            )
            if after == before:
                w.clock.now += 31.0
        self.result.failures.append(f"stuck: not settled after {HEAL_ROUNDS} healing rounds")
        self.result.failures.extend(self.checks.where_stuck())


def run(
    seed: int,
    *,
    disabled: Iterable[int] = (),
    steps: int = STEPS,
    bugs: Iterable[str] = (),
) -> Result:
    """Runs the schedule of ``seed`` without the ``disabled`` faults, ``bugs`` switched on."""
    logging.disable(logging.CRITICAL)
    names = vars(access)
    real_lane = names["Lane"]
    # The worker's lanes run their calls when the schedule says (tests/sim/lanes.py).
    names["Lane"] = SimLane
    try:
        with switched(bugs):
            return _Run(seed, frozenset(disabled), steps, bugs).go()
    finally:
        names["Lane"] = real_lane
        logging.disable(logging.NOTSET)


def shrink(seed: int, *, steps: int = STEPS, bugs: Iterable[str] = ()) -> tuple[Result, list[int]]:
    """The failing run of ``seed`` with as few of its faults as still make it fail."""
    first = run(seed, steps=steps, bugs=bugs)
    if first.ok:
        return first, []
    numbers = list(range(1, first.drawn + 1))
    disabled: set[int] = set()
    for n in numbers:
        trial = run(seed, disabled=disabled | {n}, steps=steps, bugs=bugs)
        if not trial.ok:
            disabled.add(n)
    final = run(seed, disabled=disabled, steps=steps, bugs=bugs)
    return final, [n for n in numbers if n not in disabled]


def describe(result: Result) -> str:
    """The report of a failing run: what failed, the last decisions, the replay command."""
    lines = [f"seed {result.seed} failed (trace {result.trace}):"]
    lines += [f"  {x}" for x in result.failures[:20]]
    if result.scheduled and result.scheduled != result.last:
        lines.append("  last scheduled decisions:")
        lines += [f"    {x}" for x in result.scheduled]
        lines.append("  last decisions while healing:")
        lines += [f"    {x}" for x in result.last[-8:]]
    else:
        lines.append("  last decisions:")
        lines += [f"    {x}" for x in result.last]
    lines.append(f"  replay: {replay_command(result)}")
    return "\n".join(lines)


def replay_command(result: Result) -> str:
    """The command that runs ``result``'s schedule again."""
    parts = ["python -m tests.sim", f"--seed {result.seed}"]
    parts += [f"--bug {b}" for b in result.bugs]
    if result.disabled:
        parts.append(f"--disable {','.join(map(str, result.disabled))}")
    return " ".join(parts)
