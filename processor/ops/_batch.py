"""One operator action on every saga a filter matches: `saga cancel --where ...`, a console form.

A batch is selected with the sagas list's own filters (:func:`processor.ops._filters.list_filters`,
paged by its cursor), then sent as one signed operator record per saga, each into its saga's own
partition like a single request, each carrying the batch's id. The processor decides each in its
saga's log order and records it in the audit trail with that id in its target, so the batch is
followed by reading the trail (:func:`wait_for_batch`), and `audit list --batch ID` lists it. The
command line (:mod:`processor._cli.batch`) and the console (:mod:`processor._console.batch`) are
thin callers of this module.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from processor._engine.decode import Reason
from processor._engine.rows import AuditEntry
from processor._errors import Refused, Retryable, SagaError
from processor._ports import InspectStore, RecordProducer
from processor._ports.views import SagaSummary
from processor._wire import OperatorAction
from processor.ops._filters import list_filters
from processor.ops._inspect import (
    OperatorRefused,
    RequestDeadLettered,
    dead_lettered,
    operator_request,
)

__all__ = [
    "ACTIONS",
    "ALIASES",
    "CONFIRM_OVER",
    "LIMIT",
    "WHERE_KEYS",
    "BatchSent",
    "Selection",
    "Sent",
    "confirmation",
    "confirmed",
    "parse_where",
    "select",
    "send_batch",
    "tally",
    "wait_for_batch",
]

ACTIONS: dict[str, OperatorAction] = {
    "cancel": OperatorAction.CANCEL,
    "terminate": OperatorAction.TERMINATE,
    "retry": OperatorAction.PARKED_RETRY,
    "resolve": OperatorAction.RESOLVE,
}
"""The actions a batch takes, by the name the CLI and the console give them."""

WHERE_KEYS = ("type", "status", "state", "outcome", "correlation", "attr", "older_than")
"""The sagas list's filters (the console's query parameters), which ``--where`` takes."""
ALIASES = {
    "age": "older_than",
    "correlation_id": "correlation",
    # The names of `sagas list`'s own options.
    "saga_type": "type",
    "machine_state": "state",
    "state_contains": "attr",
}

CONFIRM_OVER = 20
"""More matching sagas than this ask for a confirmation (``--confirm-over``)."""
LIMIT = 10_000
"""Most sagas one batch selects (``--limit``)."""
# Records sent per round trip to the broker; progress is reported after each.
CHUNK = 100
# The sagas list's page while selecting: a few round trips for thousands of sagas.
PAGE = 500
# How long before the wait began a request's dead letter is looked for (as for one request).
_LOOKBACK = timedelta(minutes=5)


def parse_where(items: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` selections as the filters' parameters (split on the first ``=``).

    Keys are the list filters' names or their aliases (``age``, ``correlation_id``, ...),
    with ``-`` read as ``_``; ``attr=customer_id=c-7`` is the state search ``customer_id=c-7``.

    Raises:
        SagaError: An item without ``=`` or a value, an unknown key, or one key given twice
            with different values (each filter takes one value).
    """
    where: dict[str, str] = {}
    for item in items:
        raw, sep, value = item.partition("=")
        key = raw.strip().lower().replace("-", "_")
        key = ALIASES.get(key, key)
        if not sep or not raw.strip():
            raise SagaError(f"--where {item[:80]!r}: write KEY=VALUE ({_keys()})")
        if key not in WHERE_KEYS:
            raise SagaError(f"--where {raw.strip()[:40]!r}: not a filter ({_keys()})")
        if not value.strip():
            raise SagaError(f"--where {key}: no value")
        if where.get(key, value) != value:
            raise SagaError(f"--where {key} given twice: each filter takes one value")
        where[key] = value
    if not where:
        raise SagaError(f"select the sagas with --where KEY=VALUE ({_keys()})")
    return where


def _keys() -> str:
    aliases = ", ".join(f"{a} for {k}" for a, k in ALIASES.items())
    return f"keys: {', '.join(WHERE_KEYS)}; {aliases}"


Confirmation = Literal["go", "ask", "refuse"]


def confirmation(matched: int, over: int, *, yes: bool, interactive: bool) -> Confirmation:
    """Whether a batch of ``matched`` sagas goes on, asks the person first, or is refused.

    Up to ``over`` sagas go on; more go on with ``yes`` (``--yes``), else ask someone at a
    terminal, and are refused anywhere else (a script must say ``--yes``).
    """
    if matched <= over or yes:
        return "go"
    return "ask" if interactive else "refuse"


def confirmed(answer: str, matched: int) -> bool:
    """Whether ``answer`` confirms the batch: the count of matching sagas, typed back."""
    return answer.strip() == str(matched)


@dataclass(frozen=True, slots=True)
class Selection:
    """The sagas a batch acts on.

    Attributes:
        action: ``cancel``, ``terminate``, ``retry`` or ``resolve``.
        where: The filters as given (normalised keys).
        sagas: The matching sagas, least recently changed first, ``limit`` at most.
        capped: More sagas matched than ``limit``: only the first ones are here.
        limit: The most a batch selects.
    """

    action: str
    where: Mapping[str, str]
    sagas: list[SagaSummary]
    capped: bool
    limit: int


def select(
    store: InspectStore, action: str, where: Mapping[str, str], limit: int = LIMIT
) -> Selection:
    """The sagas ``where`` matches for ``action``, paged through the sagas list by its cursor.

    Without a ``status``, cancel, terminate and resolve select sagas that have not ended
    (active and parked ones); retry selects parked sagas only, whatever is asked.

    Raises:
        SagaError: An unknown action, a malformed filter, a limit below 1, or a status or
            outcome the action never acts on.
    """
    if action not in ACTIONS:
        raise SagaError(f"a batch {action!r}: one of {', '.join(ACTIONS)}")
    if limit < 1:
        raise SagaError("bad --limit: at least 1")
    filters = list_filters(where, {k: f"--where {k}" for k in WHERE_KEYS})
    found: dict[tuple[str, str], SagaSummary] = {}
    for status in _statuses(action, where):
        after = None
        taken = 0
        # One more than the limit: whether the cap was hit.
        while (want := min(PAGE, limit + 1 - taken)) > 0:
            rows = store.list_sagas(**{**filters, "status": status, "after": after}, limit=want)
            # A saga that changed while the pages were read may come twice: kept once.
            found.update(((r.saga_type, r.saga_id), r) for r in rows)
            taken += len(rows)
            if len(rows) < want:
                break
            after = (rows[-1].updated_at, rows[-1].saga_type, rows[-1].saga_id)
    ordered = sorted(found.values(), key=lambda r: (r.updated_at, r.saga_type, r.saga_id))
    return Selection(action, dict(where), ordered[:limit], len(ordered) > limit, limit)


def _statuses(action: str, where: Mapping[str, str]) -> list[str]:
    status = where.get("status")
    if action == "retry":
        if status not in (None, "parked"):
            raise SagaError("retry replays parked sagas: --where status=parked or no status")
        statuses = ["parked"]
    else:
        statuses = [status] if status else ["active", "parked"]
    if where.get("outcome") and "ended" not in statuses:
        raise SagaError(
            "--where outcome matches ended sagas, which a batch leaves alone unless "
            "--where status=ended"
        )
    return statuses


@dataclass(frozen=True, slots=True)
class Sent:
    """One request of a batch the broker has."""

    saga_type: str
    saga_id: str
    message_id: str


@dataclass(slots=True)
class BatchSent:
    """What a batch sent: its id, the requests the broker has, and those it could not send."""

    batch: str
    action: str
    matched: int
    sent: list[Sent] = field(default_factory=list)
    # {"saga_type", "saga_id", "error"} of each request not sent.
    not_sent: list[dict[str, str]] = field(default_factory=list)


def send_batch(
    store: InspectStore,
    producer: RecordProducer,
    key: bytes | None,
    selection: Selection,
    *,
    by: str,
    reason: str,
    decision: str | None = None,
    route: Callable[[str, bytes, int], int] | None = None,
    progress: Callable[[int, int], None] | None = None,
    timeout: float = 30.0,
) -> BatchSent:
    """Records the batch in the audit trail, then sends one request per selected saga.

    The batch's own entry (action ``batch-<action>``, target ``{batch, where, matched}``,
    outcome ``sent``) is written first, so the trail says what was meant even when the sending
    stops half way. Requests go :data:`CHUNK` at a time; ``progress(sent, total)`` is called
    after each chunk. A saga that is gone or has no event to follow, or whose record the broker
    did not take, is in ``not_sent``; the rest are sent.

    Raises:
        OperatorRefused: No operator key, or no reason (nothing is recorded or sent).
        SagaError: A resolve without a decision.
    """
    if key is None:
        raise OperatorRefused("no operator key: set SAGA_OPERATOR__KEY to the processor's key")
    if not reason.strip():
        raise OperatorRefused("a reason is required")
    if selection.action == "resolve" and not decision:
        raise SagaError("a batch resolve needs the decision (--decision retry|skip|compensate)")
    action = ACTIONS[selection.action]
    sagas = selection.sagas
    out = BatchSent(uuid.uuid4().hex, selection.action, len(sagas))
    target = {"batch": out.batch, "where": dict(selection.where), "matched": len(sagas)}
    store.record_audit(
        AuditEntry(by, f"batch-{selection.action}", reason, target=target, outcome="sent")
    )
    for start in range(0, len(sagas), CHUNK):
        built: list[Sent] = []
        rows = []
        for s in sagas[start : start + CHUNK]:
            try:
                request, row = operator_request(
                    store,
                    key,
                    action=action,
                    saga_type=s.saga_type,
                    saga_id=s.saga_id,
                    by=by,
                    reason=reason,
                    name=decision,
                    route=route,
                    batch=out.batch,
                )
            except (OperatorRefused, Refused) as e:
                out.not_sent.append(_failed(s.saga_type, s.saga_id, str(e)))
                continue
            built.append(Sent(s.saga_type, s.saga_id, request.message_id))
            rows.append(row)
        try:
            failures = {f.index: f.reason for f in producer.send(rows, timeout)} if rows else {}
        except Retryable as e:
            failures = dict.fromkeys(range(len(rows)), str(e))
        for i, one in enumerate(built):
            if i in failures:
                error = f"the broker did not take the request: {failures[i]}"
                out.not_sent.append(_failed(one.saga_type, one.saga_id, error))
            else:
                out.sent.append(one)
        if progress is not None:
            progress(len(out.sent), len(sagas))
    return out


def _failed(saga_type: str, saga_id: str, error: str) -> dict[str, str]:
    return {"saga_type": saga_type, "saga_id": saga_id, "error": error}


def wait_for_batch(
    store: InspectStore,
    sent: BatchSent,
    timeout: float,
    progress: Callable[[Mapping[tuple[str, str], str], int], None] | None = None,
    poll: float = 0.5,
) -> dict[tuple[str, str], str]:
    """The outcome the processor recorded for each sent request, as far as known by ``timeout``.

    Reads the batch's audit entries among the sagas still waited for (each probe served by the
    trail's saga index) every ``poll`` seconds; ``progress(outcomes, sent)`` is called after
    each read that found more. A request a processor dead-lettered gets no entry: when a read finds
    nothing new, the first request still waited for is looked for among the dead letters, and
    counts as ``dead-lettered`` (a ``misplaced`` one). A request held behind a parked saga is
    decided only once the saga is retried: it stays waited for.

    Returns:
        (saga type, saga id) -> outcome (``applied``, ``operator-refused``, ...); sagas
        missing from it were not decided in time.

    Raises:
        RequestDeadLettered: The processor did not accept the signature of the batch's
            records (every one is signed with the same key: none will be decided).
    """
    pending = {(s.saga_type, s.saga_id): s.message_id for s in sent.sent}
    outcomes: dict[tuple[str, str], str] = {}
    started = time.monotonic()
    while pending:
        found = False
        keys = list(pending)
        for start in range(0, len(keys), 1000):
            for row in store.batch_audit(sent.batch, keys[start : start + 1000]):
                key = (row.saga_type or "", row.saga_id or "")
                if pending.pop(key, None) is not None:
                    outcomes[key] = row.outcome
                    found = True
        if found and progress is not None:
            progress(outcomes, len(sent.sent))
        waited = time.monotonic() - started
        if pending and not found:
            first, message_id = next(iter(pending.items()))
            letter = store.dead_letter_of(message_id, _LOOKBACK + timedelta(seconds=waited))
            if letter is not None and letter.reason == Reason.UNAUTHENTICATED:
                raise RequestDeadLettered(dead_lettered(message_id, letter))
            if letter is not None:
                del pending[first]
                outcomes[first] = "dead-lettered"
                continue
        if not pending or waited >= timeout:
            break
        time.sleep(poll)
    return outcomes


def tally(sent: BatchSent, outcomes: Mapping[tuple[str, str], str]) -> dict[str, int]:
    """Counts per outcome, with ``not sent`` and ``not decided in time`` (when any)."""
    counts = dict(sorted(Counter(outcomes.values()).items()))
    late = len(sent.sent) - len(outcomes)
    if late:
        counts["not decided in time"] = late
    if sent.not_sent:
        counts["not sent"] = len(sent.not_sent)
    return counts
