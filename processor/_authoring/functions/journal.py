"""What a saga function stores: its journal of resolved awaits, and the await it is suspended on.

A saga function is re-run from its start against this journal, so everything it saw (replies,
timeouts, decisions, the time each came) is kept here, in the saga's row, written in the same
transaction as the commands and deadlines the function issued.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from processor._authoring.messages import Message, MessageRegistry, registry
from processor._authoring.orchestration.retry import RetryPolicy
from processor._authoring.saga_model import SagaState

__all__ = [
    "Entry",
    "FunctionState",
    "Kind",
    "Pending",
    "Resolution",
    "TimerPayload",
    "Wire",
    "chain_after",
]

Kind = Literal["call", "undo", "send", "sleep", "wait", "decision", "patch"]
"""What an await (or a journaled step that does not wait) was: see ``SagaContext``."""

Resolution = Literal["ok", "rejected", "failed", "timed-out", "cancelled", "deadline", "decided"]
"""How an await ended: ``ok`` (the reply expected, the timer, the event), ``rejected`` (a reply
named in ``rejects``), ``failed`` (a reply named in ``retry_on``, retries spent), ``timed-out``,
``cancelled`` (``saga cancel``), ``deadline`` (the saga's own deadline passed), ``decided`` (a
person's decision)."""


class Wire(BaseModel):
    """A message as the journal keeps it: its wire name and its JSON."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    data: dict[str, Any]

    @classmethod
    def of(cls, message: Message, reg: MessageRegistry = registry) -> Wire:
        """The journal's form of ``message`` (a registered class)."""
        return cls(type=reg.of(type(message)).name, data=message.model_dump(mode="json"))

    def load(self, reg: MessageRegistry = registry) -> Message:
        """The message again, validated into its class."""
        return reg.by_name(self.type).cls.model_validate(self.data)

    def describe(self) -> str:
        """One line naming the message and its fields, for a reason that compares two."""
        return f"{self.type} {json.dumps(self.data, sort_keys=True, separators=(',', ':'))}"


class Entry(BaseModel):
    """One resolved await, or one step that does not wait (a send, a patch marker).

    Attributes:
        seq: Its place among the function's journaled steps, from 0.
        kind: What it was.
        what: A short label (the command's or event's wire name, the patch's name).
        command: The command it sent, for a call, an undo or a send.
        result: The reply or event that resolved it.
        outcome: How it ended.
        decision: A person's decision, for a decision.
        attempts: Attempts a call took.
        undo: The undo of a call whose outcome is not known (timed out, cancelled), sent if
            its success turns up late.
        expects: For such a call, the replies that would be that late success.
        at: When it resolved; the function's clock reads this on replay.

    Frozen: an entry is never changed once in the journal, so copies of the state share it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int
    kind: Kind
    what: str
    command: Wire | None = None
    result: Wire | None = None
    outcome: Resolution = "ok"
    decision: str | None = None
    attempts: int = 1
    undo: Wire | None = None
    expects: list[str] = Field(default_factory=list)
    at: datetime


class Pending(BaseModel):
    """The await the function is suspended on: what resolves it, and its timer.

    Attributes:
        seq: The journal place it will take once resolved.
        kind: What it is.
        what: A short label.
        command: The command sent (again on each retry).
        expects: Wire names of the events that resolve it well.
        rejects: Wire names of the replies that refuse it (no retry).
        retry_on: Wire names of the replies that fail an attempt (retried per ``retry``).
        timeout: How long each attempt waits; None waits for ever (or for the saga deadline).
        retry: How often a call is tried again on a timeout or a ``retry_on`` reply.
        attempt: The attempt in flight, from 1.
        backing_off: The timer is the pause before the next attempt, not a timeout.
        timer_at: When the await's timer fires, if it has one.
        since: When it was issued.
        undo: The command that undoes the call, sent if it succeeds late.
        reason: Why a person is asked, for a decision.
    """

    model_config = ConfigDict(extra="forbid")

    seq: int
    kind: Kind
    what: str
    command: Wire | None = None
    expects: list[str] = Field(default_factory=list)
    rejects: list[str] = Field(default_factory=list)
    retry_on: list[str] = Field(default_factory=list)
    timeout: timedelta | None = None
    retry: RetryPolicy | None = None
    attempt: int = 1
    backing_off: bool = False
    timer_at: datetime | None = None
    since: datetime
    undo: Wire | None = None
    reason: str | None = None


class TimerPayload(BaseModel):
    """The payload of a saga function's await timer: which await, which attempt.

    Scheduled as this model rather than a dict: the deadline's payload is dumped through a
    type adapter of its type, which a model has ready and a dict has built anew each time.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int
    attempt: int


class FunctionState(SagaState):
    """The durable state of a saga written as a function (``@saga_function``).

    The class ``@saga_function`` makes adds the start event's field, ``start``.

    Attributes:
        journal: Every resolved await, in order.
        pending: The await the function is suspended on.
        chain: A running hash of the journal; it names the function's place, so a replica keeps
            a suspended function in memory under it and resumes it only from the same place.
        started_at: When the start event came; the function's clock reads it first.
        deadline_at: The saga's own deadline, if it has one.
        compensating: The function's undos are running.
        aborted: Why they run (a refusal, a timeout, a cancel, the deadline).
        late: Events that came when nothing awaited them, and what was done about them.
    """

    journal: list[Entry] = Field(default_factory=list)
    pending: Pending | None = None
    chain: str = ""
    started_at: datetime | None = None
    deadline_at: datetime | None = None
    compensating: bool = False
    aborted: str | None = None
    late: list[str] = Field(default_factory=list)

    def waiting_on(self) -> str | None:
        """Why the saga waits on a person, while it does."""
        p = self.pending
        return p.reason if p is not None and p.kind == "decision" else None

    def cancel_refusal(self) -> str | None:
        """Why ``saga cancel`` cannot apply now, or None."""
        if self.compensating:
            return "the saga is already compensating"
        if self.pending is None:
            return "the saga waits on nothing"
        return None

    def decision_refusal(self, decision: str) -> str | None:
        """Why ``saga resolve`` cannot apply now, or None."""
        p = self.pending
        if p is None or p.kind != "decision":
            return "the saga waits on no person's decision"
        if decision not in ("retry", "skip", "compensate"):
            return "decide retry, skip or compensate"
        if decision == "compensate" and self.compensating:
            return (
                f"the saga is already compensating: {p.reason}; decide retry (send the undo "
                "again) or skip (it was undone by hand, compensation goes on)"
            )
        return None

    def waiting_kind(self) -> str | None:
        """``"undo"`` while an undo waits on a person, ``"handler"`` for the function's own ask."""
        if self.waiting_on() is None:
            return None
        return "undo" if self.compensating else "handler"

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Self:
        """The copy a handler run works on, without copying the journal's entries.

        Each handler run copies the state deeply (so that one that raises leaves it as it
        was), and the entries were most of that copy's cost, growing with the journal. An
        entry is frozen, so the copy's journal is a list of its own holding the same entries;
        the pending await is only ever replaced or has fields set, so a shallow copy of it
        does. Everything else is copied deeply, as pydantic would.
        """
        memo = {} if memo is None else memo
        memo[id(self.journal)] = list(self.journal)
        if self.pending is not None:
            memo[id(self.pending)] = self.pending.model_copy()
        return super().__deepcopy__(memo)


def chain_after(chain: str, entry: Entry) -> str:
    """The journal's running hash once ``entry`` is appended."""
    body = entry.model_dump_json().encode()
    return hashlib.blake2b(chain.encode() + body, digest_size=16).hexdigest()
