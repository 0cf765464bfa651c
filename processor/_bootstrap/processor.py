"""A processor from its settings: every loop built whole over the PostgreSQL and Kafka adapters.

This is where the replica is assembled, once, in dependency order: the metrics and spans first
(the loops report to them), the growth watch (the poller routes by it), the relay and the poller
(the worker wakes them after each commit), the worker, then what watches them. Each loop gets
every collaborator in its constructor; nothing connects until the processor starts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from processor._authoring.messages import MessageRegistry
from processor._authoring.messages import registry as default_registry
from processor._bootstrap.adapters import Adapters
from processor._bootstrap.schemas import framed, resolver_for
from processor._observe.metrics import Metrics
from processor._observe.tracing import tracing
from processor._runtime.assembly import bind_sagas, input_topics, relay_for
from processor._runtime.consumer.ownership import Ownership
from processor._runtime.consumer.placement import PlacementCheck
from processor._runtime.consumer.worker import BatchObservers, Worker
from processor._runtime.functions import function_tallies
from processor._runtime.growth import GrowthWatch
from processor._runtime.hooks import Hooks
from processor._runtime.loops import LoopHealth, Loops, after_commit
from processor._runtime.observe import Observability, Watched, batch_metrics
from processor._runtime.poller import DeadlinePoller
from processor._runtime.processor import Processor
from processor._runtime.retention import Retention
from processor._runtime.supervisor import Supervisor
from processor.settings import ProcessorSettings

__all__ = ["build_processor"]


def build_processor(
    settings: ProcessorSettings,
    saga_classes: Iterable[type[Any]] | None = None,
    *,
    dependencies: Mapping[type, object] | None = None,
    registry: MessageRegistry = default_registry,
    hooks: Hooks | None = None,
    instance_id: str | None = None,
) -> Processor:
    """One replica, its loops built from ``settings``; nothing connects before ``start()``.

    Args:
        settings: The processor's settings.
        saga_classes: Saga classes; None loads ``settings.sagas``.
        dependencies: Objects the sagas' handlers ask for.
        registry: Message types.
        hooks: Fault points for tests and benchmarks.
        instance_id: The replica's name; ``SAGA_INSTANCE_ID``, else one unique to the process.

    Raises:
        ValueError: No input topic is known for a handled event type (set
            ``SAGA_CONSUMER__TOPICS``).
    """
    adapters = Adapters(settings, instance_id)
    hooks = hooks if hooks is not None else Hooks()
    spans = tracing()
    bound = bind_sagas(
        settings,
        saga_classes,
        dependencies=dependencies,
        registry=registry,
        handler_span=(lambda t, i, r: spans.handler(t, i, r.headers_text())) if spans else None,
    )
    supervisor = Supervisor(threading.Event())
    metrics = Metrics(replica=adapters.instance_id)
    metrics.sources.functions = function_tallies(bound.sagas)
    cs = settings.consumer
    topics = input_topics(settings, bound)
    # Shared: the relay reads the owned partitions' epochs, the worker changes them.
    ownership = Ownership()
    growth = GrowthWatch(
        adapters.growth_store(),
        adapters.topic_metadata(),
        group_id=cs.group_id,
        topics=topics,
        partitioner=cs.partitioner,
        interval=cs.growth_check_interval.total_seconds(),
    )
    relay = listener = drained = None
    # Each loop its own: the consumer's and the relay's run on different threads.
    resolvers = {
        loop: resolver_for(settings.schema_registry, settings.topic_prefix, bound.registry)
        for loop in ("consumer", "relay")
    }
    metrics.sources.schema_registry = lambda: {
        loop: r.failures for loop, r in resolvers.items() if r is not None
    }

    if settings.relay.enabled:
        # On a graceful stop the relay publishes the last batch's rows while this replica still
        # owns their partitions (the consumer leaves after it: Processor._shutdown).
        drained = threading.Event()
        relay = relay_for(
            adapters.outbox_store(),
            framed(adapters.relay_producer(), resolvers["relay"]),
            settings.relay,
            hooks=hooks,
            # Each replica publishes the rows of the partitions it owns (fenced by epoch); a
            # saga's row waits for its older rows of other partitions (see the outbox store).
            owned=ownership.current,
            drain_on_stop=drained,
            tracing=spans,
        )
        listener = adapters.wake_source()
    poller = None
    if settings.deadline.enabled:
        poller = DeadlinePoller(
            adapters.deadline_store(),
            adapters.record_producer(),
            holder=adapters.instance_id,
            settings=settings.deadline,
            hooks=hooks,
            route=growth.route,
            on_fired=metrics.fired,
        )
    retention = None
    if settings.retention.enabled:
        retention = Retention(adapters.retention_store(), settings.retention, hooks=hooks)
    worker = Worker(
        store=adapters.batch_store(),
        control=adapters.batch_store(),
        store_factory=adapters.batch_store,
        planner=bound.planner,
        registry=bound.registry,
        owner=adapters.instance_id,
        consumer=lambda on_assign, on_revoke: adapters.consumer(topics, on_assign, on_revoke),
        max_record_bytes=cs.max_record_bytes,
        batch_size=cs.batch_size,
        batch_timeout=cs.batch_timeout.total_seconds(),
        max_batch_bytes=cs.max_batch_bytes,
        unavailable_timeout=cs.unavailable_timeout.total_seconds(),
        ownership=ownership,
        on_commit=after_commit(relay, poller, settings.deadline.polling.interval),
        # Relaying moves with the partitions: a gain wakes the relay.
        on_owned=relay.wake_for if relay is not None else _nothing,
        gate=growth.held,
        follow=growth,
        placement=PlacementCheck(cs.partitioner, growth.counts),
        observers=BatchObservers(on_batch=batch_metrics(metrics), tracing=spans),
        hooks=hooks,
        wire=resolvers["consumer"],
        colocate=adapters.colocation,
    )
    health = LoopHealth(supervisor)
    watched = Watched(worker, relay, health, supervisor, adapters.gauges, adapters.schema_version)
    loops = Loops(
        worker=worker,
        growth=growth,
        relay=relay,
        listener=listener,
        drained=drained,
        poller=poller,
        retention=retention,
        observe=Observability(metrics, watched, settings.metrics),
        health=health,
    )
    return Processor(
        settings, loops, bound=bound, adapters=adapters, supervisor=supervisor, hooks=hooks
    )


def _nothing() -> None:
    pass
