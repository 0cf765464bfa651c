"""The saga the simulated world runs: a few numbered steps, each a command answered by a reply.

Small on purpose, and still every kind of effect: a saga row, history, commands through the
outbox, a deadline rescheduled at each step and fired when a reply is lost, and an end. Its state
says exactly what was applied (``done``), so the invariants can compare it with the inputs.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from processor import (
    Message,
    SagaCommands,
    SagaDeadlines,
    SagaLifecycle,
    SagaState,
    message_type,
    saga,
    saga_deadline_handler,
    saga_event_handler,
)

__all__ = ["COMMANDS", "EVENTS", "NUDGE", "SAGA_TYPE", "Do", "Opened", "SimSaga", "Stepped"]

EVENTS = "sim-events"
COMMANDS = "sim-commands"
SAGA_TYPE = "sim-saga"
NUDGE = "nudge"
NUDGE_AFTER = timedelta(seconds=30)


@message_type("sim.Opened", topic=EVENTS)
class Opened(Message):
    """Starts a saga of ``steps`` steps."""

    sim_id: str
    steps: int


@message_type("sim.Stepped", topic=EVENTS)
class Stepped(Message):
    """The participant did step ``n``."""

    sim_id: str
    n: int


@message_type("sim.Do", topic=COMMANDS)
class Do(Message):
    """Do step ``n`` (the participant may see it more than once)."""

    sim_id: str
    n: int


@saga(type=SAGA_TYPE, association_property="sim_id")
class SimSaga(SagaState):
    """Asks for each step in turn; a lost reply is asked for again when the nudge fires."""

    sim_id: str = ""
    steps: int = 0
    done: list[int] = Field(default_factory=list)
    nudges: int = 0

    @saga_event_handler(Opened, start=True)
    def opened(self, event: Opened, commands: SagaCommands, deadlines: SagaDeadlines) -> None:
        self.sim_id, self.steps = event.sim_id, event.steps
        commands.send(Do(sim_id=self.sim_id, n=1))
        deadlines.schedule(NUDGE, after=NUDGE_AFTER)

    @saga_event_handler(Stepped)
    def stepped(
        self,
        event: Stepped,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
    ) -> None:
        if event.n != len(self.done) + 1:
            return  # a repeated reply: applied, with no effect
        self.done.append(event.n)
        if len(self.done) == self.steps:
            deadlines.cancel(NUDGE)
            lifecycle.end()
            return
        commands.send(Do(sim_id=self.sim_id, n=event.n + 1))
        deadlines.schedule(NUDGE, after=NUDGE_AFTER)

    @saga_deadline_handler(NUDGE)
    def nudge(self, commands: SagaCommands, deadlines: SagaDeadlines) -> None:
        self.nudges += 1
        commands.send(Do(sim_id=self.sim_id, n=len(self.done) + 1))
        deadlines.schedule(NUDGE, after=NUDGE_AFTER)
