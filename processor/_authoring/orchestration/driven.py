"""What the handlers an orchestration declares call on their saga.

The handlers ``on_reply``, ``on_decision`` and an orchestration's start event generate are
built before the saga class that runs them (``OrchestratedSaga``) is defined; they see it
through this protocol, so the modules that build them need not import the class.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Protocol

from processor._authoring.handles import SagaCommands, SagaDeadlines, SagaLifecycle
from processor._authoring.messages import Message
from processor._authoring.orchestration.progress import HandlerIo, ReplyKind
from processor._authoring.orchestration.retry import RetryPolicy
from processor._authoring.orchestration.steps import Decision

__all__ = ["Driven"]


class Driven(Protocol):
    """An orchestrated saga as its declared handlers drive it (see ``OrchestratedSaga``)."""

    def begin(
        self,
        key: Message,
        commands: HandlerIo,
        /,
        *,
        sla: timedelta | None = None,
        timeouts: Mapping[str, timedelta] | None = None,
        retries: Mapping[str, RetryPolicy] | None = None,
        late_windows: Mapping[str, timedelta] | None = None,
    ) -> None:
        """Starts the first step (``OrchestratedSaga.begin``)."""

    def reply(
        self,
        step: str,
        kind: ReplyKind,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        *,
        reason: str | None = None,
    ) -> None:
        """Applies a participant's reply about ``step`` (``OrchestratedSaga.reply``)."""

    def resolve(
        self,
        decision: Decision,
        commands: SagaCommands,
        deadlines: SagaDeadlines,
        lifecycle: SagaLifecycle,
        *,
        reason: str | None = None,
    ) -> None:
        """Applies a person's decision (``OrchestratedSaga.resolve``)."""
