"""The planner's steps for events, records newer than the code and fired deadlines.

Each receives the pass it plans in, the saga's working state and the routed item; handler runs
and parking go through :class:`~processor._engine.handlers.Handlers`.
"""

from __future__ import annotations

from processor._engine.decode import Event, FiredDeadline, TooNew
from processor._engine.handlers import Handlers
from processor._engine.output import RowWriter
from processor._engine.rows import ACTIVE, ENDED, PARKED, Outcome
from processor._engine.working import Item, MessageKey, Pass, Working
from processor._invocation import DeadlineInput, EventInput

# In the parked reason of a saga held by an event newer than the code; a processor that starts
# with newer code retries those sagas (processor._runtime.resume.resume_too_new).
TOO_NEW = "is newer than this code knows"


class EventSteps:
    """An event, or a record newer than the code, against the saga it routes to."""

    def __init__(self, writer: RowWriter, handlers: Handlers) -> None:
        self._history = writer.history
        self._run = handlers.run
        self._fail = handlers.fail
        self._park = handlers.park

    def event(self, p: Pass, w: Working, item: Item, event: Event, mkey: MessageKey) -> None:
        """Runs the event's handler, unless the saga's status decides without it."""
        ws = p.ws
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
            now = p.now
            self._run(ws, w, item, lambda: w.bound.handle_event(w.state, w.saga_id, inp, now), now)
            if w.status != PARKED:
                p.seen.add(mkey)

    def too_new(self, p: Pass, w: Working, item: Item, d: TooNew) -> None:
        """Parks the saga on a record only newer code can handle (or records it as ignored)."""
        ws = p.ws
        if w.status == PARKED:
            self._park(ws, w, item, "behind a parked saga", Outcome.PARKED_BEHIND)
        elif w.status == ENDED:
            # Whatever the new version says, an ended saga ignores it.
            self._history(ws, w, item, Outcome.IGNORED_ENDED)
        else:
            # Also when no saga exists yet: only the new code knows whether this starts one.
            reason = (
                f"{d.metadata.message_type!r} schema-version {d.version} {TOO_NEW} "
                f"(v{d.known}); it goes on by itself once code that knows it starts"
            )
            w.parked_reason = reason
            self._park(ws, w, item, reason, Outcome.PARKED)
            ws.counts["too-new"] += 1


class DeadlineSteps:
    """A fired deadline against its saga: run when it is still current, else recorded stale."""

    def __init__(self, writer: RowWriter, handlers: Handlers) -> None:
        self._history = writer.history
        self._run = handlers.run
        self._fail = handlers.fail
        self._park = handlers.park

    def fire(self, p: Pass, w: Working, item: Item, fired: FiredDeadline) -> None:
        """Runs the deadline's handler if its row still waits for this very firing."""
        ws, loaded, now, replay = p.ws, p.loaded, p.now, p.replay
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

    def refire(self, p: Pass, w: Working, item: Item, fired: FiredDeadline) -> None:
        """A fired deadline an operator's reset replays (``processor._engine.reset``).

        The saga being rebuilt keeps its deadlines in ``w.deadline_ops``, none stored: the
        deadline runs again if the rebuilt saga scheduled one of that name and still waits for
        it, with what it scheduled; else it is stale, as a fire after a cancel would have been.
        """
        ws, now = p.ws, p.now
        pending = w.deadline_ops.get(fired.name)
        if pending is None or w.status != ACTIVE or w.cleared:
            self._history(ws, w, item, Outcome.DEADLINE_STALE)
            return
        if fired.name not in w.bound.definition.deadline_handlers:
            self._fail(ws, w, item, f"no deadline handler for {fired.name!r}")
            return
        inp = DeadlineInput(fired.name, pending.id, pending.payload, pending.due_at)
        call = lambda: w.bound.handle_deadline(w.state, w.saga_id, inp, now)  # noqa: E731
        if self._run(ws, w, item, call, now) and w.deadline_ops.get(fired.name) is pending:
            w.deadline_ops[fired.name] = None
