"""The loops of one replica, built whole by the composition root (``processor._bootstrap``).

:class:`Loops` holds each loop with all its collaborators, made before the processor starts
(nothing connects until a loop first runs); :class:`processor._runtime.processor.Processor` only
starts, supervises and stops them. The wake-ups after each commit and the loops' health are the
two places where the loops meet.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from processor._engine.rows import WriteSet
from processor._ports import WakeSource
from processor._runtime.consumer.worker import Worker
from processor._runtime.growth import GrowthWatch
from processor._runtime.observe import Observability
from processor._runtime.poller import DeadlinePoller
from processor._runtime.relay import Relay
from processor._runtime.report import report_committed
from processor._runtime.retention import Retention
from processor._runtime.supervisor import Supervisor

__all__ = ["LoopHealth", "Loops", "after_commit"]


@dataclass(frozen=True)
class Loops:
    """Every loop of one replica; None for one its settings disable.

    Attributes:
        worker: The consumer loop.
        growth: Watches the input topics for added partitions.
        relay: Publishes the outbox (``SAGA_RELAY__ENABLED``).
        listener: Wakes the relay on other replicas' commits; with the relay.
        drained: Set once the last batch is committed at a stop: the relay's cue for its last
            rounds; with the relay.
        poller: Fires due deadlines (``SAGA_DEADLINE__ENABLED``).
        retention: Deletes old rows (``SAGA_RETENTION__ENABLED``).
        observe: Metrics, probes and the sampler.
        health: Which loops are alive.
    """

    worker: Worker
    growth: GrowthWatch
    relay: Relay | None
    listener: WakeSource | None
    drained: threading.Event | None
    poller: DeadlinePoller | None
    retention: Retention | None
    observe: Observability
    health: LoopHealth


class LoopHealth:
    """Which loops are alive, by name: ``consumer`` and every started background loop.

    The process is healthy only when every value is True; a dead loop also ends the process, so
    a False is seen only while it shuts down.

    Attributes:
        consuming: Whether the consumer loop runs (set by ``Processor.run``).
    """

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        self.consuming = False

    def __call__(self) -> dict[str, bool]:
        alive = {"consumer": self.consuming and not self._supervisor.failed.is_set()}
        alive.update(self._supervisor.alive())
        return alive


def after_commit(
    relay: Relay | None, poller: DeadlinePoller | None, polling: timedelta
) -> Callable[[WriteSet], None]:
    """What the worker calls with each committed batch: its report, then in-process wake-ups.

    Other replicas hear the commit through NOTIFY; the deadline poller is woken only for
    deadlines due before its next planned look (``polling``, its interval).
    """

    def committed(ws: WriteSet) -> None:
        report_committed(ws)
        if ws.outbox and relay is not None:
            # The rows' partitions, so that a relay over several workers looks at theirs alone
            # (processor/_postgres/outbox.py); a row of no partition: anywhere.
            relay.wake_for(_sources(ws))
        if poller is not None and ws.wakes_poller(datetime.now(UTC) + polling):
            poller.wake.set()

    return committed


def _sources(ws: WriteSet) -> set[tuple[str, int]] | None:
    """The input partitions of the batch's outbox rows; None when one has none."""
    sources = set()
    for row in ws.outbox:
        if row.source is None:
            return None
        sources.add(row.source)
    return sources
