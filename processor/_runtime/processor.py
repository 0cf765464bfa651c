"""One replica: starts, supervises and stops the loops the composition root built.

The loops (the consumer, the growth watch, the outbox relay and its notify listener, the
deadline poller, retention, the metrics sampler) come whole in :class:`Loops`, from
:func:`processor._bootstrap.build_processor`; this module decides only when each runs and how a
stop unwinds them. The resumption of sagas parked on something too new runs here too.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

from processor._errors import LoopDied, Retryable
from processor._observe.logs import set_replica
from processor._observe.server import check_port_free
from processor._ports.factory import AdapterFactory
from processor._runtime.assembly import BoundSagas
from processor._runtime.heartbeat import beat
from processor._runtime.hooks import HookPoint, Hooks
from processor._runtime.loops import Loops
from processor._runtime.resume import resume_too_new
from processor._runtime.stopping import CONSUMER_CLOSE, close_within
from processor._runtime.supervisor import LoopFailure, Supervisor
from processor.settings import ProcessorSettings

log = logging.getLogger(__name__)

HANG_GRACE = 60.0
"""Seconds a loop may go without a heartbeat beyond its longest legitimate wait."""

FIRST_GROWTH_WAIT = 5.0
"""Seconds the consumer's first poll waits for the growth watch's first round, at most."""


class Processor:
    """One replica: run it in as many processes as you like; they share the consumer group.

    Args:
        settings: The processor's settings.
        loops: Its loops, built whole.
        bound: The sagas it runs, their message types and the planner.
        adapters: Where its stores and clients come from (schema, resumption).
        supervisor: Runs the background loops; a loop that dies sets its stop event.
        hooks: Fault points for tests and benchmarks; nothing is registered in production.
    """

    def __init__(
        self,
        settings: ProcessorSettings,
        loops: Loops,
        *,
        bound: BoundSagas,
        adapters: AdapterFactory,
        supervisor: Supervisor,
        hooks: Hooks,
    ) -> None:
        self.settings = settings
        self.adapters = adapters
        self.hooks = hooks
        self.sagas = bound.sagas
        self.registry = bound.registry
        self.planner = bound.planner
        self.instance_id = adapters.instance_id
        # A loop that dies sets the stop event through the supervisor: the process then ends
        # non-zero instead of looking alive with a dead relay or poller.
        self.supervisor = supervisor
        self.stop_event = supervisor.stop_event
        self.loops = loops
        self.worker = loops.worker
        self.relay = loops.relay
        self.poller = loops.poller
        self.retention = loops.retention
        self.growth = loops.growth
        self.observe = loops.observe
        self._started = False
        # What the last stop left running past its budget (a consumer close, stuck loops):
        # the process should then end without the interpreter's finalisation, which could wait
        # on them for ever (see _runtime/stopping.py).
        self.left_running: list[str] = []

    def start(self) -> None:
        """Migrates (when enabled), then starts the background loops and the endpoint."""
        ms = self.settings.metrics
        if ms.port and not ms.bind_any:
            # Before anything runs: a second replica on this host must fail at once, clearly.
            check_port_free(ms.host, ms.port)
        _tune_gc()
        set_replica(self.instance_id)
        self._started = True
        self.adapters.check_transport()
        if self.settings.deadline.schema_.auto:
            self.adapters.ensure_schema()
        # Not a condition of starting: with tables by bucket a stopped Citus worker fails this
        # read of every bucket, and the replica must still start and serve the other workers'.
        self._try_resume()
        loops = self.loops
        # Each loop that beats gets a bound on the gap between two beats: its longest legitimate
        # wait plus a minute. Past it the loop is hung and /healthz fails (Supervisor.alive).
        self.supervisor.spawn("growth-watch", loops.growth.run, hang_after=HANG_GRACE)
        relay = loops.relay
        if relay is not None:
            flush = self.settings.relay.flush_timeout.total_seconds()
            self.supervisor.spawn("relay", relay.run, hang_after=2 * flush + HANG_GRACE)
        listener = loops.listener
        if listener is not None and relay is not None:
            # Another process's commit: its rows may be anywhere.
            wake = relay.wake_for
            self.supervisor.spawn("relay-listener", lambda stop: listener.run(stop, wake))
        if loops.poller is not None:
            polling = self.settings.deadline.polling.interval.total_seconds()
            self.supervisor.spawn(
                "deadline-poller", loops.poller.run, hang_after=polling + HANG_GRACE
            )
        if loops.retention is not None:
            self.supervisor.spawn("retention", loops.retention.run, hang_after=HANG_GRACE)
        resume = self.settings.consumer.resume_interval.total_seconds()
        self.supervisor.spawn(
            "parked-resume", self._resume_loop, hang_after=resume + 2 * HANG_GRACE
        )
        self.observe.start()
        log.info("processor %s started: sagas %s", self.instance_id, sorted(self.sagas))

    def _resume_too_new(self) -> None:
        """Sagas parked on something newer than older code knew go on if this code knows it."""
        versions = {t: b.state_version for t, b in self.sagas.items()}
        with self.adapters.resume_store() as store:
            results = resume_too_new(
                store, self.planner, registry=self.registry, state_versions=versions
            )
        resumed = sum(1 for r in results if r.ok)
        if resumed:
            log.info(
                "%d of %d sagas parked on a version newer than earlier code knew went on",
                resumed,
                len(results),
            )

    def _resume_loop(self, stop: threading.Event) -> None:
        """Retries, every resume interval, what a replica running older code parked meanwhile.

        In a rolling deploy an old replica that reads a row a new one wrote parks that saga;
        the new code resumes it here, with no operator.
        """
        interval = self.settings.consumer.resume_interval.total_seconds()
        while not stop.wait(interval):
            beat()
            self._try_resume()

    def _try_resume(self) -> None:
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
        if not self._started:
            self.start()
        health = self.loops.health
        health.consuming = True
        self._await_first_growth_round()
        try:
            # A background loop's death sets stop_event, so it is noticed after the poll in hand
            # (at most one batch timeout, or one batch).
            while not self.stop_event.is_set():
                self.worker.poll_once()
        except Exception as e:
            self.supervisor.record("consumer", e)
        finally:
            health.consuming = False
            self._shutdown()
        failure = self.supervisor.failure
        if failure is not None:
            raise LoopDied(failure.describe()) from failure.error

    def _await_first_growth_round(self) -> None:
        """Waits, a bounded time, for the growth watch's first look at the partition counts.

        Until then the watch holds every partition, so a partition assigned earlier is paused
        and resumed once the watch has looked. librdkafka fetches a resumed partition only at
        its broker thread's next idle wake-up, up to a second later: a replica that polled at
        once started about a second late in about half of the starts measured (S1). A store
        that is away bounds the wait at FIRST_GROWTH_WAIT; the partitions then wait, paused, as
        before.
        """
        first = self.loops.growth.first_round
        ends = time.monotonic() + FIRST_GROWTH_WAIT
        while not first.is_set() and not self.stop_event.is_set():
            left = ends - time.monotonic()
            if left <= 0:
                log.info("the growth watch has not read the partition counts yet; polling")
                return
            first.wait(min(left, 0.1))

    def stop(self) -> None:
        self.stop_event.set()

    def health(self) -> dict[str, bool]:
        """Which loops are alive, by name: ``consumer`` and every started background loop.

        The process is healthy only when every value is True; a dead loop also ends the process,
        so a False is seen only while it shuts down.
        """
        return self.loops.health()

    @property
    def metrics_port(self) -> int | None:
        """The port of /metrics, /healthz and /readyz once started; None when disabled."""
        return self.observe.port

    @property
    def failure(self) -> LoopFailure | None:
        """The first loop that died, if any."""
        return self.supervisor.failure

    def _shutdown(self) -> None:
        self.stop_event.set()
        # Loops that sleep on their own wake-up event (between relay rounds, between growth
        # checks) see the stop now rather than at the end of their sleep.
        self.growth.wake.set()
        if self.relay is not None:
            self.relay.wake.set()
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
        # The batch in flight commits or rolls back before the consumer leaves the group.
        _attempt("worker close", worker.close)
        if self.loops.drained is not None:
            # The relay publishes what is committed, then ends; the partitions are left after
            # that, so its claims still hold their epochs.
            self.loops.drained.set()
            self.supervisor.join_one("relay", lambda: min(left(), budget / 2))
        if worker.consumer is not None:
            # Leaving the group needs the broker: without it the close may never end.
            wait = min(left(), budget / 2)
            if not close_within(CONSUMER_CLOSE, worker.consumer.close, wait):
                log.warning("consumer close did not finish in %.0f s; leaving it", wait)
                self.left_running.append(CONSUMER_CLOSE)
        stuck = self.supervisor.join(left)
        if stuck:
            log.warning("loops still running at the end of the shutdown budget: %s", stuck)
            self.left_running.extend(stuck)
        _attempt("batch store close", worker.store.close)
        _attempt("control store close", worker.control.close)
        if self.relay is not None:
            _attempt("relay close", self.relay.close)
        # Last: the probes answer (unhealthy) for as long as the rest shuts down.
        hooks = self.hooks
        _attempt("shutdown hook", lambda: hooks.fire(HookPoint.BEFORE_ENDPOINT_CLOSE))
        _attempt("metrics endpoint close", self.observe.close)
        log.info("processor %s stopped", self.instance_id)


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
