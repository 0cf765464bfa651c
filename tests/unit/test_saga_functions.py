"""How a saga written as one function runs: replayed or resumed alike, versioned, bounded.

Small purpose-built functions pin down the engine's rules (``processor._authoring.functions``);
the trip function (``sagas/trip_function.py``) checks that a replay from the journal and a
resume of the coroutine held in memory are the same saga.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any

import pytest

from processor import (
    Message,
    RetryPolicy,
    SagaContext,
    Setting,
    Undo,
    message_type,
    saga_function,
)
from processor._authoring.functions import (
    JOURNAL_LIMIT,
    FunctionState,
    Nondeterminism,
    Rejected,
    TimedOut,
    function_spec,
)
from processor._authoring.functions.turn import TIMER, FunctionSpec
from processor._authoring.handles import CommandIntent
from processor._errors import ConfigurationError, HandlerError, SagaDefinitionError
from processor.testing import SagaFixture
from processor.testing._result import Result
from sagas.trip_function import trip_function
from schemas.trips import (
    ChargeDeclined,
    ChargeTrip,
    FlightCancelFailed,
    FlightCancelled,
    FlightReserved,
    HotelCancelled,
    HotelFailed,
    HotelReserved,
    HotelUnavailable,
    TripCharged,
    TripDecided,
    TripRequested,
)

TOPIC = "tests.fn-events"


@message_type("tests.fn.Start", topic=TOPIC)
class Start(Message):
    job_id: str


@message_type("tests.fn.Ping", topic=TOPIC)
class Ping(Message):
    job_id: str


@message_type("tests.fn.Pinged", topic=TOPIC)
class Pinged(Message):
    job_id: str
    fine: bool = True


@message_type("tests.fn.Pong", topic=TOPIC)
class Pong(Message):
    job_id: str


@message_type("tests.fn.Ponged", topic=TOPIC)
class Ponged(Message):
    job_id: str


@message_type("tests.fn.Refused", topic=TOPIC)
class Refused(Message):
    job_id: str
    reason: str


@message_type("tests.fn.Unping", topic=TOPIC)
class Unping(Message):
    job_id: str


@message_type("tests.fn.Unpinged", topic=TOPIC)
class Unpinged(Message):
    job_id: str


@message_type("tests.fn.Go", topic=TOPIC)
class Go(Message):
    job_id: str


@message_type("tests.fn.Note", topic=TOPIC)
class Note(Message):
    job_id: str
    text: str


@message_type("tests.fn.Ask", topic=TOPIC)
class Ask(Message):
    job_id: str
    detail: str


def _state(f: SagaFixture, saga_id: str | None = None) -> FunctionState:
    state = f._state_of(saga_id or f.saga_id)
    assert isinstance(state, FunctionState)
    return state


def _spec(cls: type) -> FunctionSpec:
    spec = function_spec(cls)
    assert spec is not None
    return spec


def _texts(r: Result) -> list[str]:
    return [c.text for c in r.commands if isinstance(c, Note)]


LATE_WINDOW = timedelta(minutes=10)  # Undo's default: how long a call in doubt is listened for

REPLAY = {"saga_functions": {"cache_size": 0}}
"""Settings under which every resolution replays the function from its journal."""


# -- replaying and resuming are the same saga ---------------------------------------------------

TID = "trip-1"
TRIP = TripRequested(
    trip_id=TID, traveller_id="ada", flight="LH 123", hotel="Adlon", amount=Decimal("812.40")
)
CHARGE = ChargeTrip(trip_id=TID, traveller_id="ada", amount=Decimal("812.40"))

Input = Message | timedelta | tuple[str, str]
"""An event delivered, time passing, or an operator's ("resolve", decision) / ("cancel", _)."""

TRIP_PATHS: dict[str, list[Input]] = {
    "completed": [
        TRIP,
        FlightReserved(trip_id=TID),
        HotelReserved(trip_id=TID),
        TripCharged(trip_id=TID),
    ],
    "declined": [
        TRIP,
        FlightReserved(trip_id=TID),
        HotelFailed(trip_id=TID, reason="busy"),
        timedelta(seconds=2),
        HotelReserved(trip_id=TID),
        ChargeDeclined(trip_id=TID, reason="card expired"),
        HotelCancelled(trip_id=TID),
        FlightCancelled(trip_id=TID),
    ],
    "hotel-timeouts": [
        TRIP,
        FlightReserved(trip_id=TID),
        timedelta(minutes=2),
        FlightCancelled(trip_id=TID),
        HotelReserved(trip_id=TID),
        HotelCancelled(trip_id=TID),
    ],
    "escalated": [
        TRIP,
        FlightReserved(trip_id=TID),
        HotelUnavailable(trip_id=TID, reason="full"),
        FlightCancelFailed(trip_id=TID, reason="non-refundable"),
        TripDecided(trip_id=TID, decision="retry"),
        FlightCancelFailed(trip_id=TID, reason="still non-refundable"),
        ("resolve", "skip"),
    ],
    "cancelled": [
        TRIP,
        FlightReserved(trip_id=TID),
        ("cancel", ""),
        HotelReserved(trip_id=TID),
        FlightCancelled(trip_id=TID),
        LATE_WINDOW,
    ],
    "deadline": [
        TRIP,
        timedelta(minutes=10),
        FlightReserved(trip_id=TID),
        FlightReserved(trip_id=TID),
        FlightCancelled(trip_id=TID),
    ],
}


def _drive(f: SagaFixture, inputs: list[Input]) -> list[list[CommandIntent]]:
    """Each input's commands, with their topics, keys and deadline headers."""
    sent = []
    for given in inputs:
        if isinstance(given, Message):
            r = f.when(given)
        elif isinstance(given, timedelta):
            r = f.when_time_elapses(given)
        elif given[0] == "cancel":
            r = f.when_cancelled()
        else:
            r = f.when_resolved(given[1])
        sent.append(r.command_intents)
    return sent


@pytest.mark.parametrize("path", sorted(TRIP_PATHS))
def test_a_replayed_trip_and_a_resumed_trip_send_the_same_commands_and_keep_the_same_state(
    path: str,
) -> None:
    suspended = _spec(trip_function).suspended
    runs = {}
    for mode, settings in (("replayed", REPLAY), ("resumed", None)):
        # The cache is the process's: forget what earlier fixtures left for this trip.
        suspended.drop(TID)
        hits = suspended.hits
        f = SagaFixture(trip_function, settings=settings)
        sent = _drive(f, TRIP_PATHS[path])
        runs[mode] = (sent, _state(f).model_dump(), f.ended)
        if mode == "replayed":
            assert suspended.hits == hits
        else:
            assert suspended.hits > hits
    assert runs["replayed"] == runs["resumed"]
    assert runs["resumed"][2], "each path runs to the trip's end"


def test_each_resolution_resumes_the_suspended_function_instead_of_replaying_it() -> None:
    suspended = _spec(trip_function).suspended
    suspended.drop(TID)
    held, hits, replays = len(suspended), suspended.hits, suspended.replays
    f = SagaFixture(trip_function)
    f.when(TRIP)
    f.when(FlightReserved(trip_id=TID))
    f.when(HotelFailed(trip_id=TID, reason="busy"))  # a retry: the function does not run
    f.when(HotelReserved(trip_id=TID))
    assert (suspended.hits - hits, suspended.replays - replays) == (2, 0)
    # Held once per saga: the suspended coroutine is replaced as the function moves on.
    assert len(suspended) == held + 1
    f.when(TripCharged(trip_id=TID)).expect_ended("COMPLETED")
    assert len(suspended) == held


def test_a_function_no_longer_held_in_memory_is_replayed_from_its_journal() -> None:
    suspended = _spec(trip_function).suspended
    f = SagaFixture(trip_function)
    f.when(TRIP)
    f.when(FlightReserved(trip_id=TID))
    # As after a restart, or on the replica that took the partition over.
    suspended.drop(TID)
    replays = suspended.replays
    f.when(HotelReserved(trip_id=TID)).expect_commands(CHARGE)
    assert suspended.replays == replays + 1


# -- a changed function ----------------------------------------------------------------------


@saga_function(type="tests-fn-versioned", association_property="job_id")
async def pong_only(saga: SagaContext, start: Start) -> None:
    await saga.call(Pong(job_id=start.job_id), expects=Ponged)


@saga_function(type="tests-fn-versioned", association_property="job_id")
async def ping_inserted(saga: SagaContext, start: Start) -> None:
    await saga.call(Ping(job_id=start.job_id), expects=Pinged)
    await saga.call(Pong(job_id=start.job_id), expects=Ponged)


@saga_function(type="tests-fn-versioned", association_property="job_id")
async def ping_patched(saga: SagaContext, start: Start) -> None:
    if saga.patched("ping-first"):
        await saga.call(Ping(job_id=start.job_id), expects=Pinged)
    await saga.call(Pong(job_id=start.job_id), expects=Ponged)


def _suspended_on_pong() -> dict[str, Any]:
    """The row of a saga the old code left waiting for Ponged, as the new code finds it."""
    old = SagaFixture(pong_only)
    old.when(Start(job_id="in-flight")).expect_commands(Pong(job_id="in-flight"))
    return _state(old).model_dump(mode="json")


def test_a_step_inserted_before_the_pending_await_parks_the_saga_naming_both_commands() -> None:
    f = SagaFixture(ping_inserted).given_stored_state(
        _suspended_on_pong(), version=1, saga_id="in-flight"
    )
    # The processor parks a saga whose handler raises; the fixture raises it.
    with pytest.raises(HandlerError) as info:
        f.when(Ponged(job_id="in-flight"))
    assert isinstance(info.value.cause, Nondeterminism)
    reason = str(info.value)
    assert 'await #0: the function now asks for call tests.fn.Ping {"job_id":"in-flight"}' in reason
    assert 'its journal recorded call tests.fn.Pong {"job_id":"in-flight"}' in reason
    assert "patched(" in reason
    state = _state(f)
    assert state.journal == []
    assert state.pending is not None
    assert state.pending.what == "tests.fn.Pong"


def test_a_change_behind_patched_finishes_in_flight_sagas_the_old_way_and_new_ones_the_new() -> (
    None
):
    # Replayed, so each resolution reads the patch marker (or its absence) from the journal.
    f = SagaFixture(ping_patched, settings=REPLAY).given_stored_state(
        _suspended_on_pong(), version=1, saga_id="in-flight"
    )
    f.when(Ponged(job_id="in-flight")).expect_no_commands().expect_ended("COMPLETED")
    assert [e.what for e in _state(f).journal] == ["tests.fn.Pong"]
    f.when(Start(job_id="new")).expect_commands(Ping(job_id="new"))
    f.when(Pinged(job_id="new")).expect_commands(Pong(job_id="new"))
    assert f.when(Ponged(job_id="new")).expect_no_commands().ended
    assert [(e.kind, e.what) for e in _state(f, "new").journal] == [
        ("patch", "ping-first"),
        ("call", "tests.fn.Ping"),
        ("call", "tests.fn.Pong"),
    ]


# -- limits and mistakes the saga is parked for -------------------------------------------------


def test_a_journal_past_its_limit_parks_the_saga_naming_the_setting() -> None:
    f = SagaFixture(trip_function, settings={JOURNAL_LIMIT: 2})
    f.when(TRIP)
    f.when(FlightReserved(trip_id=TID))
    f.when(HotelReserved(trip_id=TID)).expect_commands(CHARGE)
    with pytest.raises(HandlerError) as info:
        f.when(TripCharged(trip_id=TID))
    assert f"the journal holds 2 entries, the limit ({JOURNAL_LIMIT})" in str(info.value)
    assert len(_state(f).journal) == 2


@saga_function(type="tests-fn-io", association_property="job_id")
async def does_io(saga: SagaContext, start: Start) -> None:
    await saga.call(Ping(job_id=start.job_id), expects=Pinged)
    await asyncio.sleep(0)


def test_awaiting_anything_but_the_context_parks_the_saga() -> None:
    f = SagaFixture(does_io)
    f.when(Start(job_id="io")).expect_commands(Ping(job_id="io"))
    with pytest.raises(HandlerError) as info:
        f.when(Pinged(job_id="io"))
    assert "a saga function awaits only its context's operations" in str(info.value)
    assert "it does no I/O of its own" in str(info.value)
    assert len(_state(f).journal) == 0


@saga_function(type="tests-fn-raises", association_property="job_id")
async def raises(saga: SagaContext, start: Start) -> None:
    reply = await saga.call(Ping(job_id=start.job_id), expects=Pinged)
    if not reply.fine:
        raise ValueError("the reply made no sense")
    await saga.call(Pong(job_id=start.job_id), expects=Ponged)


def test_a_function_that_raises_parks_its_saga_and_the_others_go_on() -> None:
    suspended = _spec(raises).suspended
    f = SagaFixture(raises)
    f.when(Start(job_id="bad")).expect_commands(Ping(job_id="bad"))
    f.when(Start(job_id="good")).expect_commands(Ping(job_id="good"))
    with pytest.raises(HandlerError) as info:
        f.when(Pinged(job_id="bad", fine=False))
    assert isinstance(info.value.cause, ValueError)
    assert "ValueError: the reply made no sense" in str(info.value)
    f.when(Pinged(job_id="good")).expect_commands(Pong(job_id="good"))
    assert f.when(Ponged(job_id="good")).ended
    # The failed run's coroutine is gone with it: the next input replays the journal as stored.
    replays = suspended.replays
    f.when(Pinged(job_id="bad")).expect_commands(Pong(job_id="bad"))
    assert suspended.replays == replays + 1


# -- the clock, ids and randomness ---------------------------------------------------------------


@saga_function(type="tests-fn-clock", association_property="job_id")
async def clock(saga: SagaContext, start: Start) -> None:
    began = saga.now
    await saga.wait(Go)
    first = saga.now
    await saga.wait(Go)
    saga.send(Note(job_id=start.job_id, text=f"{began:%H:%M} {first:%H:%M} {saga.now:%H:%M}"))


def test_the_clock_of_a_replayed_function_reads_when_each_await_resolved() -> None:
    f = SagaFixture(clock, settings=REPLAY)
    f.when(Start(job_id="c"))
    f.when_time_elapses(timedelta(minutes=5))
    f.when(Go(job_id="c")).expect_no_commands()
    f.when_time_elapses(timedelta(minutes=7))
    assert _texts(f.when(Go(job_id="c"))) == ["00:00 00:05 00:12"]


@saga_function(type="tests-fn-ids", association_property="job_id")
async def ids(saga: SagaContext, start: Start) -> None:
    saga.send(Note(job_id=start.job_id, text=f"{saga.uuid()} {saga.random().random()}"))
    await saga.wait(Go)
    saga.send(Note(job_id=start.job_id, text=f"{saga.uuid()} {saga.random().random()}"))


def _ids_of(saga_id: str, settings: dict[str, Any] | None) -> list[str]:
    _spec(ids).suspended.drop(saga_id)
    f = SagaFixture(ids, settings=settings)
    return _texts(f.when(Start(job_id=saga_id))) + _texts(f.when(Go(job_id=saga_id)))


def test_ids_and_random_numbers_are_the_same_replayed_or_resumed() -> None:
    # Replayed, the first note is compared with the one in the journal: a new id would not do.
    replayed = _ids_of("i-1", REPLAY)
    assert replayed == _ids_of("i-1", None)
    words = " ".join(replayed).split()
    assert len(set(words)) == 4, "each call draws afresh"
    assert set(words).isdisjoint(" ".join(_ids_of("i-2", None)).split())


# -- timers and waits ------------------------------------------------------------------------------

WAKE = datetime(2026, 1, 2, 9, 0, tzinfo=UTC)


@saga_function(type="tests-fn-sleeps", association_property="job_id")
async def sleeper(saga: SagaContext, start: Start) -> None:
    await saga.sleep(timedelta(minutes=5))
    saga.send(Note(job_id=start.job_id, text=f"slept until {saga.now:%d %H:%M}"))
    await saga.until(WAKE)
    saga.send(Note(job_id=start.job_id, text=f"woke at {saga.now:%d %H:%M}"))


def test_sleep_and_until_wake_the_function_on_the_saga_clock() -> None:
    f = SagaFixture(sleeper)
    f.when(Start(job_id="s")).expect_deadline_scheduled(TIMER, after=timedelta(minutes=5))
    f.when_time_elapses(timedelta(minutes=4, seconds=59)).expect_no_commands()
    r = f.when_time_elapses(timedelta(seconds=1))
    assert _texts(r) == ["slept until 01 00:05"]
    r.expect_deadline_scheduled(TIMER, at=WAKE)
    f.when_time_elapses(WAKE - f.now - timedelta(seconds=1)).expect_no_commands()
    r = f.when_time_elapses(timedelta(seconds=1))
    assert _texts(r) == ["woke at 02 09:00"]
    r.expect_ended("COMPLETED")


@saga_function(type="tests-fn-naive", association_property="job_id")
async def naive(saga: SagaContext, start: Start) -> None:
    await saga.until(datetime(2026, 1, 2, 9, 0))


def test_until_a_naive_datetime_parks_the_saga() -> None:
    with pytest.raises(HandlerError, match="until\\(\\) takes a timezone-aware datetime"):
        SagaFixture(naive).when(Start(job_id="n"))


@saga_function(type="tests-fn-waits", association_property="job_id")
async def waiter(saga: SagaContext, start: Start) -> None:
    got = await saga.wait(Go, timeout=timedelta(minutes=1))
    saga.send(Note(job_id=start.job_id, text=repr(got)))


def test_wait_returns_the_event_or_none_once_its_timeout_passes() -> None:
    f = SagaFixture(waiter)
    f.when(Start(job_id="w-1"))
    f.when(Start(job_id="w-2"))
    f.when_time_elapses(timedelta(seconds=59)).expect_no_commands()
    r = f.when(Go(job_id="w-1"))
    assert _texts(r) == ["Go(job_id='w-1')"]
    assert r.ended
    r = f.when_time_elapses(timedelta(seconds=1))
    assert _texts(r) == ["None"]
    assert f.when(Go(job_id="w-2")).expect_ignored().ended


# -- what a function is given --------------------------------------------------------------------


class Greeter:
    """A dependency: the app registers one, the function is given it."""

    def __init__(self, word: str) -> None:
        self.word = word

    def greet(self, name: str) -> str:
        return f"{self.word} {name}"


@saga_function(type="tests-fn-injected", association_property="job_id")
async def injected(
    saga: SagaContext,
    start: Start,
    greeter: Greeter,
    punctuation: Annotated[str, Setting("tests.fn.punctuation")],
) -> None:
    await saga.wait(Go)
    saga.send(Note(job_id=start.job_id, text=greeter.greet(start.job_id) + punctuation))


def test_a_function_is_given_its_dependencies_and_settings() -> None:
    f = SagaFixture(
        injected, settings={"tests.fn.punctuation": "!"}, dependencies={Greeter: Greeter("hello")}
    )
    f.when(Start(job_id="d"))
    assert _texts(f.when(Go(job_id="d"))) == ["hello d!"]


def test_a_function_held_with_other_dependencies_is_replayed_with_the_ones_given_now() -> None:
    settings = {"tests.fn.punctuation": "."}
    first = SagaFixture(injected, settings=settings, dependencies={Greeter: Greeter("hello")})
    first.when(Start(job_id="e"))
    # The same saga at the same place, as another app in the process sees it.
    second = SagaFixture(injected, settings=settings, dependencies={Greeter: Greeter("hi")})
    second.given_stored_state(_state(first).model_dump(mode="json"), version=1, saga_id="e")
    assert _texts(second.when(Go(job_id="e"))) == ["hi e."]


def test_a_function_missing_a_setting_fails_at_binding_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"setting 'tests\.fn\.punctuation' is missing"):
        SagaFixture(injected, dependencies={Greeter: Greeter("hello")})


# -- declaration mistakes --------------------------------------------------------------------------


def test_a_plain_def_is_refused() -> None:
    with pytest.raises(SagaDefinitionError, match="a saga function is an `async def`"):

        @saga_function(type="tests-fn-sync", association_property="job_id")  # type: ignore[type-var]
        def sync(saga: SagaContext, start: Start) -> None:
            pass


def test_a_start_parameter_without_its_event_class_is_refused() -> None:
    with pytest.raises(SagaDefinitionError, match="annotate the second parameter, 'start'"):

        @saga_function(type="tests-fn-unannotated", association_property="job_id")
        async def unannotated(saga: SagaContext, start) -> None:  # type: ignore[no-untyped-def]
            pass


def test_replies_the_source_does_not_name_must_be_listed_in_events() -> None:
    with pytest.raises(SagaDefinitionError) as info:

        @saga_function(type="tests-fn-unread", association_property="job_id")
        async def unread(saga: SagaContext, start: Start) -> None:
            replies = (Pinged, Refused)
            await saga.call(Ping(job_id=start.job_id), expects=replies)

    [problem] = info.value.problems
    assert "cannot tell which events `replies` names before the saga runs" in problem
    assert "@saga_function(events=...)" in problem

    @saga_function(type="tests-fn-unread", association_property="job_id", events=[Pinged, Refused])
    async def listed(saga: SagaContext, start: Start) -> None:
        replies = (Pinged, Refused)
        await saga.call(Ping(job_id=start.job_id), expects=replies)

    f = SagaFixture(listed)
    f.when(Start(job_id="l")).expect_commands(Ping(job_id="l"))
    f.when(Pinged(job_id="l")).expect_ended("COMPLETED")


# -- undos -----------------------------------------------------------------------------------------


@saga_function(type="tests-fn-goes-on", association_property="job_id")
async def goes_on(saga: SagaContext, start: Start) -> None:
    try:
        undo = Undo(Unping(job_id=start.job_id), expects=Unpinged)
        await saga.call(Ping(job_id=start.job_id), expects=Pinged, undo=undo)
        await saga.call(Pong(job_id=start.job_id), expects=Ponged, rejects=Refused)
    except Rejected:
        await saga.compensate()
    await saga.wait(Go)


def test_a_function_that_compensates_and_goes_on_can_be_cancelled_again() -> None:
    f = SagaFixture(goes_on)
    f.when(Start(job_id="g"))
    f.when(Pinged(job_id="g")).expect_commands(Pong(job_id="g"))
    f.when(Refused(job_id="g", reason="no")).expect_commands(Unping(job_id="g"))
    assert _state(f).compensating
    f.when(Unpinged(job_id="g")).expect_no_commands().expect_active()
    # Its undos are done: a cancel is no longer refused as "already compensating".
    assert not _state(f).compensating
    f.when_cancelled().expect_no_commands().expect_ended("CANCELLED")


@saga_function(
    type="tests-fn-slow-undo",
    association_property="job_id",
    sla=timedelta(minutes=1),
    escalation=lambda start, e: Ask(job_id=start.job_id, detail=e.detail),
)
async def slow_undo(saga: SagaContext, start: Start) -> None:
    policy = RetryPolicy(max_attempts=3, base_delay=timedelta(seconds=1))
    undo = Undo(
        Unping(job_id=start.job_id), expects=Unpinged, timeout=timedelta(seconds=10), retry=policy
    )
    await saga.call(Ping(job_id=start.job_id), expects=Pinged, undo=undo)
    await saga.wait(Go)


def test_an_undo_is_retried_after_the_saga_deadline_passed() -> None:
    f = SagaFixture(slow_undo)
    f.when(Start(job_id="u"))
    f.when(Pinged(job_id="u")).expect_no_commands()
    f.when_time_elapses(timedelta(minutes=1)).expect_commands(Unping(job_id="u"))
    # The deadline is long gone, but the undo's own policy decides: three attempts, then a person.
    f.when_time_elapses(timedelta(minutes=1)).expect_commands(
        Unping(job_id="u"),
        Unping(job_id="u"),
        Ask(job_id="u", detail="undo tests.fn.Unping failed: no reply after 3 attempt(s)"),
    )
    assert _state(f).waiting_on() == "undo tests.fn.Unping failed: no reply after 3 attempt(s)"


@saga_function(type="tests-fn-in-doubt", association_property="job_id")
async def in_doubt(saga: SagaContext, start: Start) -> None:
    await saga.call(
        Ping(job_id=start.job_id),
        expects=Pinged,
        timeout=timedelta(seconds=30),
        undo=Undo(Unping(job_id=start.job_id), expects=Unpinged),
    )


def test_a_call_that_timed_out_and_then_succeeded_is_undone_and_counts_as_compensated() -> None:
    f = SagaFixture(in_doubt)
    f.when(Start(job_id="d"))
    f.when_time_elapses(timedelta(seconds=30)).expect_no_commands().expect_active()
    f.when_time_elapses(LATE_WINDOW - timedelta(seconds=1)).expect_active()
    f.when(Pinged(job_id="d")).expect_commands(Unping(job_id="d"))
    f.when(Unpinged(job_id="d")).expect_ended("COMPENSATED")


def test_a_call_that_timed_out_and_never_answered_fails_once_the_late_window_passed() -> None:
    f = SagaFixture(in_doubt)
    f.when(Start(job_id="d"))
    f.when_time_elapses(timedelta(seconds=30) + LATE_WINDOW).expect_no_commands().expect_ended(
        "FAILED"
    )
    f.when(Pinged(job_id="d")).expect_ignored()


@saga_function(type="tests-fn-moves-on", association_property="job_id")
async def moves_on(saga: SagaContext, start: Start) -> None:
    undo = Undo(Unping(job_id=start.job_id), expects=Unpinged)
    try:
        await saga.call(
            Ping(job_id=start.job_id), expects=Pinged, timeout=timedelta(seconds=30), undo=undo
        )
    except TimedOut:
        await saga.call(Pong(job_id=start.job_id), expects=Ponged)


def test_a_late_success_of_a_call_the_function_moved_on_from_is_undone_once() -> None:
    f = SagaFixture(moves_on)
    f.when(Start(job_id="m"))
    f.when_time_elapses(timedelta(seconds=30)).expect_commands(Pong(job_id="m"))
    f.when(Pinged(job_id="m")).expect_commands(Unping(job_id="m"))
    f.when(Pinged(job_id="m")).expect_no_commands()
    f.when(Ponged(job_id="m")).expect_ended("COMPLETED")


@saga_function(type="tests-fn-calls-again", association_property="job_id")
async def calls_again(saga: SagaContext, start: Start) -> None:
    undo = Undo(Unping(job_id=start.job_id), expects=Unpinged)
    try:
        await saga.call(
            Ping(job_id=start.job_id), expects=Pinged, timeout=timedelta(seconds=30), undo=undo
        )
    except TimedOut:
        await saga.call(Ping(job_id=start.job_id), expects=Pinged, undo=undo)
    await saga.wait(Go)


def test_a_late_answer_to_a_call_made_again_does_not_undo_what_the_second_call_booked() -> None:
    f = SagaFixture(calls_again)
    f.when(Start(job_id="a"))
    f.when_time_elapses(timedelta(seconds=30)).expect_commands(Ping(job_id="a"))
    f.when(Pinged(job_id="a")).expect_no_commands()
    # The first attempt's answer, late: the booking it reports is the one the saga now holds.
    f.when(Pinged(job_id="a")).expect_no_commands()
    f.when(Go(job_id="a")).expect_ended("COMPLETED")
