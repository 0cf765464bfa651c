"""Property: the fixture's deadline store follows the engine's rules under any op sequence."""

from datetime import timedelta
from typing import Literal

from hypothesis import given, settings
from hypothesis import strategies as st

from processor import (
    Message,
    SagaDeadlines,
    SagaLifecycle,
    SagaState,
    message_type,
    saga,
    saga_deadline_handler,
    saga_event_handler,
)
from processor.testing import DEFAULT_START_TIME, SagaFixture

Op = tuple[Literal["schedule", "cancel"], Literal["a", "b", "c"], int]


@message_type("test.deadlines.Begin")
class Begin(Message):
    timer_id: str
    ops: list[Op]


@message_type("test.deadlines.More")
class More(Message):
    timer_id: str
    ops: list[Op]
    end: bool = False


@saga(type="timers")
class Timers(SagaState):
    fired: list[str] = []  # noqa: RUF012  (pydantic copies field defaults per instance)

    @saga_event_handler(Begin, association_property="timer_id", start=True)
    def begin(self, event: Begin, deadlines: SagaDeadlines) -> None:
        _run(event.ops, deadlines)

    @saga_event_handler(More, association_property="timer_id")
    def more(self, event: More, deadlines: SagaDeadlines, lifecycle: SagaLifecycle) -> None:
        _run(event.ops, deadlines)
        if event.end:
            lifecycle.end()

    @saga_deadline_handler("a")
    def on_a(self) -> None:
        self.fired = [*self.fired, "a"]

    @saga_deadline_handler("b")
    def on_b(self) -> None:
        self.fired = [*self.fired, "b"]

    @saga_deadline_handler("c")
    def on_c(self, deadlines: SagaDeadlines) -> None:
        self.fired = [*self.fired, "c"]
        # Re-arming itself once exercises "a handler may reschedule its own deadline".
        if self.fired.count("c") == 1:
            deadlines.schedule("c", timedelta(minutes=1000))


def _run(ops: list[Op], deadlines: SagaDeadlines) -> None:
    for kind, name, minutes in ops:
        if kind == "schedule":
            deadlines.schedule(name, timedelta(minutes=minutes))
        else:
            deadlines.cancel(name)


ops = st.lists(
    st.tuples(
        st.sampled_from(["schedule", "cancel"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(min_value=1, max_value=500),
    ),
    max_size=8,
)


@settings(max_examples=80, deadline=None, database=None)
@given(batches=st.lists(ops, min_size=1, max_size=4), end=st.booleans())
def test_last_schedule_not_cancelled_survives_and_fires_in_due_order(
    batches: list[list[Op]], end: bool
) -> None:
    fixture = SagaFixture(Timers)
    model: dict[str, int] = {}  # name -> due minute
    order: dict[str, int] = {}  # name -> when it was (re)scheduled, for tie-breaking
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        if i == 0:
            fixture.when(Begin(timer_id="x", ops=batch))
        else:
            fixture.when(More(timer_id="x", ops=batch, end=end and last))
        for j, (kind, name, minutes) in enumerate(batch):
            if kind == "schedule":
                model[name] = minutes
                order[name] = i * 100 + j
            else:
                model.pop(name, None)
    if end and len(batches) > 1:
        model.clear()

    expected = {n: DEFAULT_START_TIME + timedelta(minutes=m) for n, m in model.items()}
    assert fixture.pending_deadlines == expected

    result = fixture.when_time_elapses(timedelta(minutes=600))
    due_order = sorted(model, key=lambda n: (model[n], order[n]))
    assert result.fired == due_order
    result.expect_state(fired=due_order)
    # "c" re-armed itself 1000 minutes after it fired; nothing else is left.
    assert set(fixture.pending_deadlines) == ({"c"} if "c" in model else set())
