"""A user's application module, as `saga-processor run tests.e2e.gated_app:app` imports it.

The saga's handler asks for a `Gate`, a dependency the app builds with a factory: it refuses
while the flag file `gate` in $GATED_APP_DIR does not say "open", and its factory writes
`closed-<pid>` there when the process closes it. `broken_app` runs a saga whose handler asks for a
type nothing provides.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from processor import (
    Message,
    SagaApp,
    SagaLifecycle,
    SagaState,
    message_type,
    saga,
    saga_event_handler,
)

EVENTS = "gated-events"
SAGA_TYPE = "tests.gated-job"
NEEDY_TYPE = "tests.needy-job"


@message_type("tests.gated.JobRequested", topic=EVENTS)
class JobRequested(Message):
    job_id: str


class Gate:
    """Lets jobs through while its flag file says "open"."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def check(self, job_id: str) -> None:
        state = self.flag.read_text().strip() if self.flag.exists() else "missing"
        if state != "open":
            raise RuntimeError(f"gate is {state}; job {job_id} must wait")


class AuditLog:
    """A dependency no app here provides."""


def app_dir() -> Path:
    return Path(os.environ["GATED_APP_DIR"])


@contextmanager
def open_gate() -> Iterator[Gate]:
    yield Gate(app_dir() / "gate")
    (app_dir() / f"closed-{os.getpid()}").write_text("closed\n")


@saga(type=SAGA_TYPE)
class GatedJob(SagaState):
    """Starts on a request, passes the gate, and ends."""

    job_id: str = ""

    @saga_event_handler(JobRequested, association_property="job_id", start=True)
    def requested(self, event: JobRequested, gate: Gate, lifecycle: SagaLifecycle) -> None:
        gate.check(event.job_id)
        self.job_id = event.job_id
        lifecycle.end()


@saga(type=NEEDY_TYPE)
class NeedyJob(SagaState):
    """Needs an audit log that `broken_app` does not provide."""

    @saga_event_handler(JobRequested, association_property="job_id", start=True)
    def audited(self, event: JobRequested, audit: AuditLog) -> None:
        """Never runs: the app refuses to start."""


app = SagaApp(sagas=[GatedJob], factories={Gate: open_gate}, settings={"topic_prefix": "unused."})
broken_app = SagaApp(sagas=[GatedJob, NeedyJob], factories={Gate: open_gate})
