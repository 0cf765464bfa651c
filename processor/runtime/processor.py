"""One replica: the consumer loop and the background loops, built from an adapter factory.

The background loops are the growth watch, the outbox relay, its notify listener, the deadline
poller, retention and the resumption of sagas parked on something too new. Every store, client
and source comes from the :class:`processor.ports.AdapterFactory` given (``processor.bootstrap``
builds one from settings: :func:`processor.bootstrap.build_processor`).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from processor.engine.rows import WriteSet
from processor.errors import LoopDied, Retryable
from processor.messages import MessageRegistry
from processor.messages import registry as default_registry
from processor.observe.logs import set_replica
from processor.observe.server import check_port_free
from processor.ports.factory import AdapterFactory
from processor.runner import BoundSaga
from processor.runtime.assembly import bind_sagas, relay_for
from processor.runtime.growth import GrowthWatch
from processor.runtime.heartbeat import beat
from processor.runtime.hooks import HookPoint, Hooks
from processor.runtime.observe import Observability
from processor.runtime.ownership import Ownership
from processor.runtime.placement import PlacementCheck
from processor.runtime.poller import DeadlinePoller
from processor.runtime.relay import Relay
from processor.runtime.report import report_committed
from processor.runtime.retention import Retention
from processor.runtime.stopping import CONSUMER_CLOSE, close_within
from processor.runtime.supervisor import LoopFailure, Supervisor
from processor.runtime.worker import Worker
from processor.settings import ProcessorSettings
from processor.wire import Topics

log = logging.getLogger(__name__)

HANG_GRACE = 60.0
"""Seconds a loop may go without a heartbeat beyond its longest legitimate wait."""


class Processor:
    """One replica: run it in as many processes as you like; they share the consumer group."""

    def __init__(
        self,
        settings: ProcessorSettings,
        saga_classes: Iterable[type[Any]] | None = None,
        *,
        adapters: AdapterFactory,
        dependencies: Mapping[type, object] | None = None,
        registry: MessageRegistry = default_registry,
        hooks: Hooks | None = None,
    ) -> None:
        self.settings = settings
        self.adapters = adapters
        # Fault points for tests and benchmarks; nothing is registered in production.
        self.hooks = hooks if hooks is not None else Hooks()
        bound = bind_sagas(settings, saga_classes, dependencies=dependencies, registry=registry)
        self.sagas: dict[str, BoundSaga] = bound.sagas
        self.registry = bound.registry
        self.planner = bound.planner
        self.instance_id = adapters.instance_id
        self.stop_event = threading.Event()
        # A loop that dies sets stop_event through the supervisor: the process then ends
        # non-zero instead of looking alive with a dead relay or poller.
        self.supervisor = Supervisor(self.stop_event)
        self._consuming = False
        self.worker: Worker | None = None
        self.relay: Relay | None = None
        # Set once the last batch is committed at a stop: the relay's cue for its last rounds.
        self._last_commit: threading.Event | None = None
        self.poller: DeadlinePoller | None = None
        # Metrics, probes and spans (processor/runtime/observe.py), made in start().
        self.observe: Observability | None = None
        self.retention: Retention | None = None
        self.growth: GrowthWatch | None = None
        # What the last stop left running past its budget (a consumer close, stuck loops):
        # the process should then end without the interpreter's finalisation, which could wait
        # on them for ever (see runtime/stopping.py).
        self.left_running: list[str] = []

    # -- wiring ----------------------------------------------------------------------------

    def input_topics(self) -> list[str]:
        """The topics this replica consumes, with the topic prefix applied."""
        topics = Topics(self.settings.topic_prefix)
        if self.settings.consumer.topics:
            return [topics.name(t) for t in self.settings.consumer.topics]
        missing = [
            cls.__name__ for cls in self.planner.event_types if self.registry.of(cls).topic is None
        ]
        if missing:
            raise ValueError(f"no input topic known for {missing}: set SAGA_CONSUMER__TOPICS")
        found = {self.registry.of(cls).topic for cls in self.planner.event_types}
        return sorted(topics.name(t) for t in found if t)

    def start(self) -> None:
        """Migrates (when enabled), then starts the background threads and the consumer."""
        ms = self.settings.metrics
        if ms.port and not ms.bind_any:
            # Before anything runs: a second replica on this host must fail at once, clearly.
            check_port_free(ms.host, ms.port)
        _tune_gc()
        set_replica(self.instance_id)
        adapters = self.adapters
        adapters.check_transport()
        if self.settings.deadline.schema_.auto:
            adapters.ensure_schema()
        self._resume_too_new()
        cs = self.settings.consumer
        part = cs.partitioner

        # Made first: the relay reads the owned partitions' epochs, the worker changes them.
        ownership = Ownership()
        topics = self.input_topics()
        growth = self.growth = GrowthWatch(
            adapters.growth_store(),
            adapters.topic_metadata(),
            group_id=cs.group_id,
            topics=topics,
            partitioner=cs.partitioner,
            interval=cs.growth_check_interval.total_seconds(),
        )
        # Each loop that beats gets a bound on the gap between two beats: its longest legitimate
        # wait plus a minute. Past it the loop is hung and /healthz fails (Supervisor.alive).
        self._spawn("growth-watch", growth.run, hang_after=HANG_GRACE)
        if self.settings.relay.enabled:
            rs = self.settings.relay
            relay = self.relay = relay_for(
                adapters.outbox_store(),
                adapters.relay_producer(),
                rs,
                hooks=self.hooks,
                # Each replica publishes the rows of the partitions it owns (fenced by epoch); a
                # saga's row waits for its older rows of other partitions (see the outbox store).
                owned=ownership.current,
            )
            # On a graceful stop the relay publishes the last batch's rows while this replica
            # still owns their partitions (see stop: the consumer leaves after it).
            relay.drain_on_stop = self._last_commit = threading.Event()
            listener = adapters.wake_source()
            self._spawn(
                "relay", relay.run, hang_after=2 * rs.flush_timeout.total_seconds() + HANG_GRACE
            )
            self._spawn("relay-listener", lambda stop: listener.run(stop, relay.wake.set))
        if self.settings.deadline.enabled:
            self.poller = DeadlinePoller(
                adapters.deadline_store(),
                adapters.record_producer(),
                holder=self.instance_id,
                settings=self.settings.deadline,
                hooks=self.hooks,
            )
            self.poller.route = growth.route
            polling = self.settings.deadline.polling.interval.total_seconds()
            self._spawn("deadline-poller", self.poller.run, hang_after=polling + HANG_GRACE)
        if self.settings.retention.enabled:
            self.retention = Retention(
                adapters.retention_store(),
                self.settings.retention,
                hooks=self.hooks,
            )
            self._spawn("retention", self.retention.run, hang_after=HANG_GRACE)
        resume = cs.resume_interval.total_seconds()
        self._spawn("parked-resume", self._resume_loop, hang_after=resume + 2 * HANG_GRACE)
        # Before the worker: the worker reports each batch to it.
        self.observe = Observability(self)
        self.worker = Worker(
            store=adapters.batch_store(),
            control=adapters.batch_store(),
            store_factory=adapters.batch_store,
            planner=self.planner,
            registry=self.registry,
            owner=self.instance_id,
            consumer=lambda on_assign, on_revoke: adapters.consumer(topics, on_assign, on_revoke),
            max_record_bytes=cs.max_record_bytes,
            batch_size=cs.batch_size,
            batch_timeout=cs.batch_timeout.total_seconds(),
            max_batch_bytes=cs.max_batch_bytes,
            unavailable_timeout=cs.unavailable_timeout.total_seconds(),
            ownership=ownership,
            on_commit=self._committed,
            # Relaying moves with the partitions: a gain wakes the relay.
            on_owned=self.relay.wake.set if self.relay is not None else _nothing,
            gate=growth.held,
            follow=growth,
            placement=PlacementCheck(part, growth.counts),
            observers=self.observe.batches,
            hooks=self.hooks,
        )
        self.observe.start()
        log.info("processor %s started: sagas %s", self.instance_id, sorted(self.sagas))

    def _resume_too_new(self) -> None:
        """Sagas parked on something newer than older code knew go on if this code knows it."""
        versions = {t: b.state_version for t, b in self.sagas.items()}
        resumed, tried = self.adapters.resume_parked(self.planner, self.registry, versions)
        if resumed:
            log.info(
                "%d of %d sagas parked on a version newer than earlier code knew went on",
                resumed,
                tried,
            )

    def _resume_loop(self, stop: threading.Event) -> None:
        """Retries, every resume interval, what a replica running older code parked meanwhile.

        In a rolling deploy an old replica that reads a row a new one wrote parks that saga;
        the new code resumes it here, with no operator.
        """
        interval = self.settings.consumer.resume_interval.total_seconds()
        while not stop.wait(interval):
            beat()
            try:
                self._resume_too_new()
            except Retryable as e:
                log.warning("resuming parked sagas failed (%s); trying again later", e)
            except Exception as e:
                # The database away (a raw driver error from a fresh connection) or one saga's
                # replay refused: the sagas stay parked as they were; the next pass tries again.
                # Consuming goes on either way.
                log.warning(
                    "resuming parked sagas failed (%s: %s); trying again later",
                    type(e).__name__,
                    e,
                )

    def _committed(self, ws: WriteSet) -> None:
        report_committed(ws)
        # In-process wake-ups right after a commit; other replicas hear NOTIFY.
        if ws.outbox and self.relay is not None:
            self.relay.wake.set()
        if self.poller is not None and ws.wakes_poller(
            datetime.now(UTC) + self.settings.deadline.polling.interval
        ):
            self.poller.wake.set()

    def _spawn(
        self,
        name: str,
        target: Callable[[threading.Event], None],
        *,
        hang_after: float | None = None,
    ) -> None:
        self.supervisor.spawn(name, target, hang_after=hang_after)

    # -- running ---------------------------------------------------------------------------

    def run(self) -> None:
        """Consumes until `stop()`; the batch in hand is committed or abandoned, never split.

        Raises:
            LoopDied: A loop (the consumer, the relay, its listener, the deadline poller or
                retention)
                ended on an error; the others were shut down first. The process should exit
                non-zero so that the platform restarts it.
        """
        if self.worker is None:
            self.start()
        assert self.worker is not None
        self._consuming = True
        try:
            # A background loop's death sets stop_event, so it is noticed after the poll in hand
            # (at most one batch timeout, or one batch).
            while not self.stop_event.is_set():
                self.worker.poll_once()
        except Exception as e:
            self.supervisor.record("consumer", e)
        finally:
            self._consuming = False
            self._shutdown()
        failure = self.supervisor.failure
        if failure is not None:
            raise LoopDied(failure.describe()) from failure.error

    def stop(self) -> None:
        self.stop_event.set()

    def health(self) -> dict[str, bool]:
        """Which loops are alive, by name: ``consumer`` and every started background loop.

        The process is healthy only when every value is True; a dead loop also ends the process,
        so a False is seen only while it shuts down.
        """
        alive = {"consumer": self._consuming and not self.supervisor.failed.is_set()}
        alive.update(self.supervisor.alive())
        return alive

    @property
    def metrics_port(self) -> int | None:
        """The port of /metrics, /healthz and /readyz once started; None when disabled."""
        return None if self.observe is None else self.observe.port

    @property
    def failure(self) -> LoopFailure | None:
        """The first loop that died, if any."""
        return self.supervisor.failure

    def _shutdown(self) -> None:
        self.stop_event.set()
        # Loops that sleep on their own wake-up event (between relay rounds, between growth
        # checks) see the stop now rather than at the end of their sleep.
        for loop in (self.growth, self.relay):
            if loop is not None:
                loop.wake.set()
        # One budget for the whole shutdown, so that a platform's grace period is respected
        # however many pieces hang. A tenth of it (2 s at most) is kept for the closes after
        # the waits, so that a stop whose relay and consumer both wait on a broker that is gone
        # still ends in time.
        whole = self.settings.shutdown_timeout.total_seconds()
        budget = whole - min(2.0, whole / 10)
        ends = time.monotonic() + budget

        def left() -> float:
            return max(0.0, ends - time.monotonic())

        worker = self.worker
        if worker is not None:
            # The batch in flight commits or rolls back before the consumer leaves the group.
            _attempt("worker close", worker.close)
        if self._last_commit is not None:
            # The relay publishes what is committed, then ends; the partitions are left after
            # that, so its claims still hold their epochs.
            self._last_commit.set()
            self.supervisor.join_one("relay", lambda: min(left(), budget / 2))
        if worker is not None and worker.consumer is not None:
            # Leaving the group needs the broker: without it the close may never end.
            wait = min(left(), budget / 2)
            if not close_within(CONSUMER_CLOSE, worker.consumer.close, wait):
                log.warning("consumer close did not finish in %.0f s; leaving it", wait)
                self.left_running.append(CONSUMER_CLOSE)
        stuck = self.supervisor.join(left)
        if stuck:
            log.warning("loops still running at the end of the shutdown budget: %s", stuck)
            self.left_running.extend(stuck)
        if worker is not None:
            _attempt("batch store close", worker.store.close)
            _attempt("control store close", worker.control.close)
        if self.relay is not None:
            _attempt("relay close", self.relay.close)
        # Last: the probes answer (unhealthy) for as long as the rest shuts down.
        hooks = self.hooks
        _attempt("shutdown hook", lambda: hooks.fire(HookPoint.BEFORE_ENDPOINT_CLOSE))
        if self.observe is not None:
            _attempt("metrics endpoint close", self.observe.close)
        log.info("processor %s stopped", self.instance_id)


def _nothing() -> None:
    pass


def _attempt(what: str, action: Callable[[], None]) -> None:
    """Runs one shutdown step; a failure is logged, and the rest of the shutdown goes on."""
    try:
        action()
    except Exception:
        log.warning("%s failed during shutdown", what, exc_info=True)


def _tune_gc() -> None:
    """Keeps the cyclic garbage collector off the hot path.

    The startup heap (pydantic schemas, client libraries, saga definitions) is large and lives
    for the whole process, yet every collection of the old generation would walk it again;
    freezing moves it out of the collector's sight. Each event allocates a few hundred
    short-lived objects that reference counting frees, so young collections are made rarer than
    CPython's default of one per 700 allocations.
    """
    gc.collect()
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(50_000, gen1, gen2)
