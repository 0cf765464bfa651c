"""An orchestrated saga's step in flight, as `show` and the console's saga page show it.

Built from what the saga stores: its progress (the step, the attempt made last, the last
failure) and its pending step timer, whose payload (a
:class:`processor._authoring.orchestration.steps.StepTimer`) says what the step waits for and until
when.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from processor._authoring.orchestration.progress import STEP_TIMER
from processor._ports.views import PendingDeadline, StepProgress

__all__ = ["step_progress"]


def step_progress(
    state: dict[str, Any] | None, deadlines: Sequence[PendingDeadline]
) -> StepProgress | None:
    """The step in flight and its last failure, or None.

    None for a saga that is not orchestrated, or that has neither a step in flight nor a
    failure kept.
    """
    progress = (state or {}).get("progress")
    if not isinstance(progress, dict):
        return None
    step = _text(progress.get("step"))
    phase = "forward"
    attempt = _number(progress.get("attempt")) or 0
    failure = _text(progress.get("undo_failure")) or _text(progress.get("reason"))
    waiting = due = following = None
    timer = next(
        (d for d in deadlines if d.name == STEP_TIMER and isinstance(d.payload, dict)), None
    )
    if timer is not None and timer.payload is not None:
        step = _text(timer.payload.get("step")) or step
        phase = _text(timer.payload.get("phase")) or phase
        waiting = _text(timer.payload.get("purpose"))
        due = timer.due_at
        of = _number(timer.payload.get("attempt"))
        if of is not None and waiting == "retry":
            following = of + 1  # backing off after that attempt failed
        elif of is not None and waiting == "resume":
            following = of  # the attempt never ran: sent again as it was
    elif step is None and isinstance(undo := progress.get("undo_queue"), list) and undo:
        step, phase = _text(undo[0]), "undo"
    if step is None and failure is None:
        return None
    return StepProgress(
        step=step,
        phase=phase,
        attempt=attempt,
        waiting=waiting,
        due_at=due,
        next_attempt=following,
        last_failure=failure,
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
