"""Plans one batch: runs handlers in log order over loaded saga rows and collects every write.

Pure: the caller loads what `wants()` names, calls `plan()`, and writes the returned `WriteSet`
in one transaction. Handlers only record intents, so a batch that fails to commit is simply
planned again from freshly loaded rows.

Nothing that goes wrong for one saga escapes `plan()`: stored state that no longer loads, a
handler that keeps failing, a command that cannot be encoded or a deadline without a handler
parks that saga (its later records wait behind it) with a reason that names the error's type and
where it happened, never payload values.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from processor.engine.decode import (
    Decoded,
    Event,
    FiredDeadline,
    Reason,
    Rejected,
    TooNew,
    id_problem,
)
from processor.engine.records import OutboxRow, Record
from processor.engine.rows import (
    ACTIVE,
    ENDED,
    PARKED,
    DeadLetter,
    DeadlineInsert,
    HistoryRow,
    Loaded,
    Outcome,
    ParkedMessage,
    SagaKey,
    SagaRow,
    SagaStatus,
    SagaWrite,
    Wants,
    WriteSet,
)
from processor.errors import HandlerError
from processor.handles import CancelDeadline, CommandIntent, DeadlineOp, ScheduleDeadline
from processor.messages import (
    HEADER_CAUSATION_ID,
    HEADER_CORRELATION_ID,
    HEADER_DEADLINE_UNIX_MS,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SAGA_ID,
    HEADER_SAGA_TYPE,
    HEADER_SCHEMA_VERSION,
    Message,
    MessageRegistry,
)
from processor.runner import BoundSaga, DeadlineInput, EventInput, command_message_id
from processor.upcasting import MissingUpcaster
from processor.wire import HEADER_TRACEPARENT, HEADER_TRACESTATE, Topics, child_traceparent

# Seeded from the OS once per process, so replicas never share a sequence.
_random_bits = random.Random().getrandbits


def _random_id() -> str:
    # 32 random hex digits are a valid uuid for the column. The id only has to be unique, not
    # secret, so the in-process generator serves (os.urandom is a syscall per id).
    return f"{_random_bits(128):032x}"


@dataclass(frozen=True, slots=True)
class Item:
    """One unit of work for one saga: an event routed to it, or a deadline that fired."""

    decoded: Event | FiredDeadline | TooNew
    bound: BoundSaga
    saga_id: str

    @property
    def message_id(self) -> str:
        """The id that marks this item applied: the message's, or one made from the deadline's."""
        if isinstance(self.decoded, FiredDeadline):
            return f"deadline:{self.decoded.deadline_id}"
        return self.decoded.metadata.message_id


@dataclass(slots=True)
class _Working:
    """A saga's in-memory state while the batch runs over it."""

    bound: BoundSaga
    saga_id: str
    row: SagaRow | None
    state: Any  # SagaState | None
    status: SagaStatus | None
    version: int
    parked_reason: str | None = None
    # Why the stored state does not load; the row's JSON is then written back untouched.
    load_error: str | None = None
    dirty: bool = False
    # Net deadline changes: name -> new row, or None for "delete only".
    deadline_ops: dict[str, DeadlineInsert | None] = field(default_factory=dict)
    cleared: bool = False


class Planner:
    """Routes decoded records to sagas and plans the batch's writes."""

    def __init__(
        self,
        sagas: Mapping[str, BoundSaga],
        *,
        registry: MessageRegistry,
        dead_letter_topic: str,
        handler_attempts: int = 3,
        topic_prefix: str = "",
        deadline_ids: Callable[[], str] | None = None,
    ) -> None:
        self._sagas = dict(sagas)
        # A virtual clock (the saga fixture) passes ids that grow in scheduling order, so equal
        # due times fire in that order; in production the order of ties is unspecified.
        self._deadline_ids = deadline_ids or _random_id
        self._registry = registry
        self._dead_letter_topic = dead_letter_topic
        self._attempts = handler_attempts
        self._topics = Topics(topic_prefix)
        # Wraps each handler call (an OpenTelemetry span, see processor/observe/tracing.py).
        self.handler_span: Callable[[str, str, Record], AbstractContextManager[object]] | None = (
            None
        )
        self._now_text: tuple[datetime | None, str] = (None, "")
        self._routes: dict[type[Message], list[BoundSaga]] = {}
        # For records newer than the code: by wire name, the sagas that handle some version of
        # it and the association property of the newest version they handle.
        self._routes_by_name: dict[str, dict[str, tuple[int, BoundSaga, str]]] = {}
        for bound in self._sagas.values():
            for event_cls, handler in bound.definition.event_handlers.items():
                self._routes.setdefault(event_cls, []).append(bound)
                if event_cls in registry and handler.association_property is not None:
                    entry = registry.of(event_cls)
                    by_saga = self._routes_by_name.setdefault(entry.name, {})
                    known = by_saga.get(bound.saga_type)
                    if known is None or known[0] < entry.version:
                        by_saga[bound.saga_type] = (
                            entry.version,
                            bound,
                            handler.association_property,
                        )

    @property
    def event_types(self) -> set[type[Message]]:
        """The message types some saga handles; other events are skipped."""
        return set(self._routes)

    def route(self, decoded: Iterable[Decoded]) -> tuple[list[Item | Rejected], Wants]:
        """Expands each record into per-saga items, in order, and names the rows to load."""
        out: list[Item | Rejected] = []
        wants = Wants(set(), set(), set())
        for d in decoded:
            if isinstance(d, Rejected):
                out.append(d)
            elif isinstance(d, FiredDeadline):
                bound = self._sagas.get(d.saga_type)
                if bound is None:
                    out.append(
                        Rejected(d.record, Reason.UNKNOWN_TYPE, f"no saga type {d.saga_type!r}")
                    )
                    continue
                out.append(Item(d, bound, d.saga_id))
                wants.saga_keys.add((d.saga_type, d.saga_id))
                wants.deadline_ids.add(d.deadline_id)
            elif isinstance(d, TooNew):
                out.extend(self._route_too_new(d, wants))
            else:
                routes = self._routes.get(type(d.message), [])
                items: list[Item | Rejected] = []
                for bound in routes:
                    saga_id = bound.definition.association_value(d.message)
                    prop = bound.definition.event_handlers[type(d.message)].association_property
                    if saga_id is None:
                        items = [Rejected(d.record, Reason.MISSING_ASSOCIATION, f"{prop} is empty")]
                        break
                    problem = id_problem(saga_id)
                    if problem is not None:
                        items = [Rejected(d.record, Reason.INVALID_ID, f"{prop} {problem}")]
                        break
                    items.append(Item(d, bound, saga_id))
                for item in items:
                    if isinstance(item, Item):
                        key = (item.bound.saga_type, item.saga_id)
                        wants.saga_keys.add(key)
                        wants.message_keys.add((*key, item.message_id))
                out.extend(items)
        return out, wants

    def _route_too_new(self, d: TooNew, wants: Wants) -> list[Item | Rejected]:
        """Routes a record newer than the code by rule, without its class.

        The saga id is the value of the field the newest known version is associated by, read
        from the raw JSON; when the new version lacks that field, the record key (the wire
        format's saga id). A message no saga handles in any version is not routed.
        """
        items: list[Item | Rejected] = []
        for _, bound, prop in self._routes_by_name.get(d.metadata.message_type, {}).values():
            raw = d.data.get(prop) if isinstance(d.data, dict) else None
            if isinstance(raw, str | int) and not isinstance(raw, bool) and str(raw):
                saga_id: str | None = str(raw)
            else:
                saga_id = d.metadata.key or None
            if saga_id is None:
                return [Rejected(d.record, Reason.MISSING_ASSOCIATION, f"{prop} is empty")]
            problem = id_problem(saga_id)
            if problem is not None:
                return [Rejected(d.record, Reason.INVALID_ID, f"{prop} {problem}")]
            items.append(Item(d, bound, saga_id))
        for item in items:
            assert isinstance(item, Item)
            key = (item.bound.saga_type, item.saga_id)
            wants.saga_keys.add(key)
            wants.message_keys.add((*key, item.message_id))
        return items

    def plan(
        self,
        items: Sequence[Item | Rejected],
        loaded: Loaded,
        now: datetime,
        *,
        unrouted: int = 0,
        replay: bool = False,
    ) -> WriteSet:
        """Runs the items' handlers in order over ``loaded`` and returns the batch's writes.

        Args:
            items: Routed items and rejected records, in log order.
            loaded: The rows that ``route`` named.
            now: The clock reading handlers see.
            unrouted: Records no saga handles, for the counts.
            replay: The items were held behind a parked saga and are replayed by an operator:
                a fired deadline then applies if its row still matches and is due, whatever
                its token (it was consumed in log order; the lease may have moved on since).

        Returns:
            Every write of the batch; never raises for one saga's problem.
        """
        ws = WriteSet()
        ws.counts["unrouted"] += unrouted
        working: dict[SagaKey, _Working] = {}
        seen: set[tuple[str, str, str]] = set(loaded.applied)
        for item in items:
            if isinstance(item, Rejected):
                self._dead_letter(ws, item.record, item.reason, item.detail)
                continue
            key = (item.bound.saga_type, item.saga_id)
            w = working.get(key)
            if w is None:
                w = working[key] = self._load(
                    item.bound, item.saga_id, loaded.sagas.get(key), key in loaded.tombstones
                )
            if isinstance(item.decoded, FiredDeadline):
                self._fire(ws, w, item, item.decoded, loaded, now, replay)
            else:
                mkey = (*key, item.message_id)
                if mkey in seen:
                    self._history(ws, w, item, Outcome.DUPLICATE)
                    continue
                if isinstance(item.decoded, TooNew):
                    self._too_new(ws, w, item, item.decoded)
                    continue
                self._event(ws, w, item, item.decoded, now, seen, mkey)
        for w in working.values():
            self._flush(ws, w)
        return ws

    # -- per item --------------------------------------------------------------------------

    def _load(
        self, bound: BoundSaga, saga_id: str, row: SagaRow | None, purged: bool = False
    ) -> _Working:
        if row is None:
            # A tombstone: the saga ended and retention purged its row. It stays ended.
            return _Working(bound, saga_id, None, None, ENDED if purged else None, 0)
        try:
            state = (
                bound.state_from_json(row.state, row.state_version)
                if row.state is not None
                else None
            )
        except MissingUpcaster as e:
            w = _Working(bound, saga_id, row, None, row.status, row.version, row.parked_reason)
            w.load_error = str(e)[:1000]
            return w
        except Exception as e:  # any error of the saga's own model (validators run user code)
            w = _Working(bound, saga_id, row, None, row.status, row.version, row.parked_reason)
            cls = bound.definition.state_cls.__qualname__
            at = ""
            if row.state_version != bound.state_version:
                at = f" v{bound.state_version} (upcast from v{row.state_version})"
            w.load_error = f"stored state does not load into {cls}{at}: {describe_error(e)}"[:1000]
            return w
        return _Working(bound, saga_id, row, state, row.status, row.version, row.parked_reason)

    def _fail(self, ws: WriteSet, w: _Working, item: Item, reason: str) -> None:
        """Parks the saga on ``item`` for a reason of its own (not held behind another)."""
        w.parked_reason = reason
        self._park(ws, w, item, reason, Outcome.PARKED)
        ws.counts["handler-failed"] += 1

    def _event(
        self,
        ws: WriteSet,
        w: _Working,
        item: Item,
        event: Event,
        now: datetime,
        seen: set[tuple[str, str, str]],
        mkey: tuple[str, str, str],
    ) -> None:
        handler = w.bound.definition.event_handlers[type(event.message)]
        if w.status == PARKED:
            self._park(ws, w, item, "behind a parked saga", Outcome.PARKED_BEHIND)
        elif w.status == ENDED:
            detail = "ended; purged by retention" if w.row is None else None
            self._history(ws, w, item, Outcome.IGNORED_ENDED, detail=detail)
        elif w.status is None and not handler.start:
            self._history(ws, w, item, Outcome.NO_SAGA)
        elif w.load_error is not None:
            self._fail(ws, w, item, w.load_error)
        else:
            inp = EventInput(event.message, event.metadata)
            self._run(ws, w, item, lambda: w.bound.handle_event(w.state, w.saga_id, inp, now), now)
            if w.status != PARKED:
                seen.add(mkey)

    def _too_new(self, ws: WriteSet, w: _Working, item: Item, d: TooNew) -> None:
        if w.status == PARKED:
            self._park(ws, w, item, "behind a parked saga", Outcome.PARKED_BEHIND)
        elif w.status == ENDED:
            # Whatever the new version says, an ended saga ignores it.
            self._history(ws, w, item, Outcome.IGNORED_ENDED)
        else:
            # Also when no saga exists yet: only the new code knows whether this starts one.
            reason = (
                f"{d.metadata.message_type!r} schema-version {d.version} is newer than this "
                f"code knows (v{d.known}); deploy code that knows it, then retry the saga"
            )
            w.parked_reason = reason
            self._park(ws, w, item, reason, Outcome.PARKED)
            ws.counts["too-new"] += 1

    def _fire(
        self,
        ws: WriteSet,
        w: _Working,
        item: Item,
        fired: FiredDeadline,
        loaded: Loaded,
        now: datetime,
        replay: bool,
    ) -> None:
        ref = loaded.deadlines.get(fired.deadline_id)
        if ref is not None and (ref.saga_type, ref.saga_id, ref.name) != (
            fired.saga_type,
            fired.saga_id,
            fired.name,
        ):
            # The id names another saga's (or another name's) deadline: forged or corrupt.
            detail = "the deadline row belongs to another saga or name"
            self._history(ws, w, item, Outcome.DEADLINE_REJECTED, detail=detail)
            return
        if w.status == PARKED:
            self._park(ws, w, item, "behind a parked saga", Outcome.PARKED_BEHIND)
            return
        if replay:
            current = ref is not None and ref.due_at <= now
        else:
            current = (
                ref is not None
                and ref.dispatch_token == fired.token
                # fired by a poller that has since lost the lease
                and loaded.lease_token == fired.token
            )
        stale = (
            not current
            or w.status != ACTIVE
            or w.cleared
            or fired.name in w.deadline_ops  # cancelled or rescheduled earlier in this batch
        )
        if stale or ref is None:
            if (
                ref is not None
                and not replay
                and ref.dispatch_token == fired.token
                and loaded.lease_token != fired.token
                and w.status == ACTIVE
                and not w.cleared
                and fired.name not in w.deadline_ops
            ):
                # Consumed without effect while the row still waits under this dead token: make
                # it due again, so the current leader fires it (no timer that lag can outrun).
                ws.deadline_resets.append((fired.deadline_id, fired.token))
            self._history(ws, w, item, Outcome.DEADLINE_STALE)
            return
        if fired.name not in w.bound.definition.deadline_handlers:
            # Kept, like a failed handler's deadline: a deploy that brings the handler back,
            # then a retry, runs it.
            self._fail(ws, w, item, f"no deadline handler for {fired.name!r}")
            return
        if w.load_error is not None:
            self._fail(ws, w, item, w.load_error)
            return
        inp = DeadlineInput(fired.name, fired.deadline_id, ref.payload, ref.due_at)
        call = lambda: w.bound.handle_deadline(w.state, w.saga_id, inp, now)  # noqa: E731
        if self._run(ws, w, item, call, now) and not w.cleared:
            # Consumed by its own handler's transaction, unless the handler set it anew. A
            # handler that failed keeps it, so the parked saga's retry runs it once fixed.
            w.deadline_ops.setdefault(fired.name, None)

    def _run(self, ws: WriteSet, w: _Working, item: Item, call: Any, now: datetime) -> bool:
        """Runs a handler with its retries; parks the saga and returns False if it fails."""
        error: HandlerError | None = None
        span = self.handler_span
        for _ in range(self._attempts):
            try:
                if span is None:
                    outcome = call()
                else:
                    with span(w.bound.saga_type, w.saga_id, item.decoded.record):
                        outcome = call()
                break
            except HandlerError as e:
                error = e
            except Exception as e:  # not the handler's: no retry would change it
                self._fail(ws, w, item, describe_error(e)[:1000])
                return False
        else:
            assert error is not None
            cause = error.cause if getattr(error, "cause", None) is not None else error
            self._fail(ws, w, item, f"{error.handler_name}: {describe_error(cause)}"[:1000])
            return False
        correlation = self._correlation(item)
        trace = _trace(item.decoded.record)
        rows: list[OutboxRow] = []
        for i, intent in enumerate(outcome.commands):
            try:
                rows.append(self._command(w, intent, i, item.message_id, correlation, now, trace))
            except Exception as e:  # e.g. a class nobody registered: nothing is applied
                what = type(intent.message).__qualname__
                reason = f"{outcome.handler_name}: command {i} ({what}): {describe_error(e)}"
                self._fail(ws, w, item, reason[:1000])
                return False
        w.state = outcome.state
        w.version += 1
        w.dirty = True
        w.status = ENDED if outcome.ended else ACTIVE
        ws.outbox.extend(rows)
        if outcome.ended:
            w.cleared = True
            w.deadline_ops.clear()
        else:
            for op in outcome.deadlines:
                self._deadline(w, op, item)
        self._history(ws, w, item, Outcome.APPLIED, version=w.version, detail=outcome.handler_name)
        ws.counts["ended" if outcome.ended else "applied"] += 1
        return True

    def _deadline(self, w: _Working, op: DeadlineOp, item: Item) -> None:
        if isinstance(op, CancelDeadline):
            w.deadline_ops[op.name] = None
            return
        assert isinstance(op, ScheduleDeadline)
        record = item.decoded.record
        traceparent, tracestate = _trace(record)
        w.deadline_ops[op.name] = DeadlineInsert(
            id=self._deadline_ids(),
            saga_type=w.bound.saga_type,
            saga_id=w.saga_id,
            name=op.name,
            due_at=op.due_at,
            payload=op.payload,
            # Fired records go back to the partition this saga's input arrives on.
            topic=record.topic,
            partition=record.partition,
            traceparent=traceparent,
            tracestate=tracestate,
        )

    def _park(self, ws: WriteSet, w: _Working, item: Item, reason: str, outcome: Outcome) -> None:
        w.status = PARKED
        w.version += 1
        w.dirty = True
        ws.parked.append(ParkedMessage(w.bound.saga_type, w.saga_id, item.decoded.record, reason))
        self._history(ws, w, item, outcome, version=w.version, detail=reason)

    # -- output rows -----------------------------------------------------------------------

    def _history(
        self,
        ws: WriteSet,
        w: _Working,
        item: Item,
        outcome: Outcome,
        *,
        version: int | None = None,
        detail: str | None = None,
    ) -> None:
        record = item.decoded.record
        if isinstance(item.decoded, FiredDeadline):
            kind, message_type = "deadline", f"deadline:{item.decoded.name}"
        else:
            kind, message_type = "event", item.decoded.metadata.message_type
        ws.history.append(
            HistoryRow(
                w.bound.saga_type,
                w.saga_id,
                item.message_id,
                message_type,
                kind,
                outcome,
                version,
                record.topic,
                record.partition,
                record.offset,
                detail,
            )
        )
        if outcome is not Outcome.APPLIED:
            ws.counts[outcome] += 1

    def _correlation(self, item: Item) -> str:
        if isinstance(item.decoded, Event) and item.decoded.metadata.correlation_id:
            return item.decoded.metadata.correlation_id
        return item.saga_id

    def _command(
        self,
        w: _Working,
        intent: CommandIntent,
        index: int,
        causation: str,
        correlation: str,
        now: datetime,
        trace: tuple[str | None, str | None] = (None, None),
    ) -> OutboxRow:
        mtype = self._registry.of(type(intent.message))
        for name, text in intent.headers.items():
            if "\x00" in name or "\x00" in text:
                raise ValueError(f"header {name[:64]!r} holds a NUL character")
        # Version and position make the id stable if this input is ever planned again; the
        # version is the one this input's handler produces.
        seq = ((w.version + 1) << 16) | index
        message_id = command_message_id(w.bound.saga_type, w.saga_id, seq)
        traceparent, tracestate = trace
        headers: dict[str, str] = {}
        if traceparent is not None:
            # The command continues the event's trace, one span further (see wire).
            child = child_traceparent(traceparent, message_id)
            if child is not None:
                headers[HEADER_TRACEPARENT] = child
                if tracestate:
                    headers[HEADER_TRACESTATE] = tracestate
        headers.update(intent.headers)
        headers.update(
            {
                HEADER_MESSAGE_ID: message_id,
                HEADER_MESSAGE_TYPE: mtype.name,
                HEADER_SCHEMA_VERSION: str(mtype.version),
                HEADER_CORRELATION_ID: correlation,
                HEADER_CAUSATION_ID: causation,
                HEADER_OCCURRED_AT: self._occurred_at(now),
                HEADER_SAGA_TYPE: w.bound.saga_type,
                HEADER_SAGA_ID: w.saga_id,
            }
        )
        if intent.deadline_unix_ms is not None:
            headers[HEADER_DEADLINE_UNIX_MS] = str(intent.deadline_unix_ms)
        return OutboxRow(
            saga_type=w.bound.saga_type,
            saga_id=w.saga_id,
            topic=self._topics.name(intent.topic),
            key=intent.key.encode(),
            headers=headers,
            value=intent.message.model_dump_json().encode(),
        )

    def _occurred_at(self, now: datetime) -> str:
        # One batch shares one clock reading; format it once rather than once per command.
        if self._now_text[0] is not now:
            self._now_text = (now, now.isoformat())
        return self._now_text[1]

    def _dead_letter(self, ws: WriteSet, record: Record, reason: str, detail: str) -> None:
        record = storable(record)
        ws.dead_letters.append(DeadLetter(record, reason, detail))
        headers = {
            **record.headers_text(),
            "dead-letter-reason": reason,
            "dead-letter-detail": detail,
            "source-topic": record.topic,
            "source-partition": str(record.partition),
            "source-offset": str(record.offset),
        }
        ws.outbox.append(
            OutboxRow(None, None, self._dead_letter_topic, record.key, headers, record.value or b"")
        )
        ws.counts["dead-lettered"] += 1

    def _flush(self, ws: WriteSet, w: _Working) -> None:
        if not w.dirty:
            return
        raw = w.load_error is not None and w.row is not None
        ws.sagas.append(
            SagaWrite(
                saga_type=w.bound.saga_type,
                saga_id=w.saga_id,
                state=(
                    w.row.state
                    if raw and w.row is not None
                    else w.bound.state_to_json(w.state)
                    if w.state is not None
                    else None
                ),
                status=w.status or PARKED,
                version=w.version,
                expected_version=w.row.version if w.row is not None else None,
                parked_reason=w.parked_reason if w.status == PARKED else None,
                machine_state=w.bound.machine_state(w.state),
                # A state that did not load is written back as it was, at its own version.
                state_version=(
                    w.row.state_version if raw and w.row is not None else w.bound.state_version
                ),
            )
        )
        key = (w.bound.saga_type, w.saga_id)
        if w.cleared:
            ws.deadline_clears.append(key)
        for name, insert in w.deadline_ops.items():
            ws.deadline_deletes.append((*key, name))
            if insert is not None:
                ws.deadline_inserts.append(insert)


def _trace(record: Record) -> tuple[str | None, str | None]:
    """The record's W3C trace context headers, as (traceparent, tracestate)."""
    if not record.headers:
        return None, None
    state = record.header(HEADER_TRACESTATE)
    if state is not None and ("\x00" in state or len(state) > 512):
        state = None  # not a valid tracestate (at most 32 short members), and unstorable
    return record.header(HEADER_TRACEPARENT), state


def describe_error(error: BaseException) -> str:
    """The error's type and where it happened, without the values it was given.

    A pydantic ``ValidationError`` is reduced to its field locations and messages (its text
    echoes the input, which may hold personal data); other errors keep their message, which is
    the code's own text.
    """
    if isinstance(error, ValidationError):
        details = error.errors(include_input=False, include_url=False, include_context=False)
        where = "; ".join(
            f"{'.'.join(map(str, d['loc'])) or '<root>'}: {d['msg']}" for d in details[:10]
        )
        more = f" (+{len(details) - 10} more)" if len(details) > 10 else ""
        return f"ValidationError at {where}{more}"
    return f"{type(error).__name__}: {error}"


def storable(record: Record) -> Record:
    """``record`` with NUL characters in its header names and values replaced, for jsonb.

    The key and value are stored as bytes and kept exactly; only the headers, stored as JSON,
    are changed, and only when they hold a NUL.
    """
    if not any("\x00" in k or b"\x00" in v for k, v in record.headers):
        return record
    headers = tuple(
        (k.replace("\x00", "\ufffd"), v.replace(b"\x00", "\ufffd".encode()))
        for k, v in record.headers
    )
    return dataclasses.replace(record, headers=headers)
