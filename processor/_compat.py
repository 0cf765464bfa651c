"""Old module paths, kept importing for one release: each names the module it is now.

The package was reorganised into public packages (``processor``, ``processor.participant``,
``processor.publish``, ``processor.testing``, ``processor.ops``, ``processor.settings``) and
internal ones, whose paths have a leading underscore. An import of an old path, such as
``processor.runtime.worker``, warns with a :class:`DeprecationWarning` naming the new path and
gives the module that lives there: the same object, so ``isinstance`` checks and monkeypatching
agree whichever path was used. :func:`install` puts the finder first in :data:`sys.meta_path`;
``processor/__init__.py`` calls it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import FrameType, ModuleType

__all__ = ["MOVED", "install", "message", "new_path"]

# Old dotted module path -> the module's path now.
MOVED: dict[str, str] = {
    "processor._choices": "processor._authoring.choices",
    "processor._marks": "processor._authoring.marks",
    "processor._saga_model": "processor._authoring.saga_model",
    "processor.application": "processor._authoring.application",
    "processor.asyncapi": "processor._authoring.asyncapi",
    "processor.binding": "processor._authoring.binding",
    "processor.bootstrap": "processor._bootstrap",
    "processor.bootstrap.adapters": "processor._bootstrap.adapters",
    "processor.bootstrap.clients": "processor._bootstrap.clients",
    "processor.bootstrap.errors": "processor._bootstrap.errors",
    "processor.bootstrap.outbox": "processor._bootstrap.outbox",
    "processor.bootstrap.participant": "processor._bootstrap.participant",
    "processor.bootstrap.processor": "processor._bootstrap.processor",
    "processor.bootstrap.service": "processor._bootstrap.service",
    "processor.cli": "processor._cli",
    "processor.cli.batch": "processor._cli.batch",
    "processor.cli.commands": "processor._cli.commands",
    "processor.cli.follow": "processor._cli.follow",
    "processor.cli.inject": "processor._cli.inject",
    "processor.cli.inspect": "processor._cli.inspect",
    "processor.cli.main": "processor._cli.main",
    "processor.cli.operate": "processor._cli.operate",
    "processor.cli.participant": "processor._cli.participant",
    "processor.cli.preflight": "processor._cli.preflight",
    "processor.cli.requests": "processor._cli.requests",
    "processor.cli.reset": "processor._cli.reset",
    "processor.cli.stored": "processor._cli.stored",
    "processor.cli.topics": "processor._cli.topics",
    "processor.console": "processor._console",
    "processor.console.actions": "processor._console.actions",
    "processor.console.app": "processor._console.app",
    "processor.console.auth": "processor._console.auth",
    "processor.console.backend": "processor._console.backend",
    "processor.console.batch": "processor._console.batch",
    "processor.console.outage": "processor._console.outage",
    "processor.console.protect": "processor._console.protect",
    "processor.console.query": "processor._console.query",
    "processor.console.serve": "processor._console.serve",
    "processor.definition": "processor._authoring.definition",
    "processor.engine": "processor._engine",
    "processor.engine.decode": "processor._engine.decode",
    "processor.engine.growth": "processor._engine.growth",
    "processor.engine.handlers": "processor._engine.handlers",
    "processor.engine.inject": "processor._engine.inject",
    "processor.engine.limits": "processor._engine.limits",
    "processor.engine.operate": "processor._engine.operate",
    "processor.engine.output": "processor._engine.output",
    "processor.engine.overlay": "processor._engine.overlay",
    "processor.engine.partitioner": "processor._engine.partitioner",
    "processor.engine.plan": "processor._engine.plan",
    "processor.engine.prepare": "processor._engine.prepare",
    "processor.engine.records": "processor._engine.records",
    "processor.engine.reset": "processor._engine.reset",
    "processor.engine.route": "processor._engine.route",
    "processor.engine.rows": "processor._engine.rows",
    "processor.engine.steps": "processor._engine.steps",
    "processor.engine.working": "processor._engine.working",
    "processor.errors": "processor._errors",
    "processor.handles": "processor._authoring.handles",
    "processor.kafka": "processor._kafka",
    "processor.kafka.admin": "processor._kafka.admin",
    "processor.kafka.client": "processor._kafka.client",
    "processor.kafka.errors": "processor._kafka.errors",
    "processor.kafka.group_view": "processor._kafka.group_view",
    "processor.kafka.lazy": "processor._kafka.lazy",
    "processor.kafka.logs": "processor._kafka.logs",
    "processor.kafka.metadata": "processor._kafka.metadata",
    "processor.kafka.producer": "processor._kafka.producer",
    "processor.kafka.tracked": "processor._kafka.tracked",
    "processor.kafka.watermarks": "processor._kafka.watermarks",
    "processor.machine": "processor._authoring.orchestration",
    "processor.machine._declared": "processor._authoring.orchestration.declared",
    "processor.machine._generated": "processor._authoring.orchestration.generated",
    "processor.machine.analysis": "processor._authoring.orchestration.analysis",
    "processor.machine.driven": "processor._authoring.orchestration.driven",
    "processor.machine.orchestrator": "processor._authoring.orchestration.orchestrator",
    "processor.machine.progress": "processor._authoring.orchestration.progress",
    "processor.machine.replies": "processor._authoring.orchestration.replies",
    "processor.machine.retry": "processor._authoring.orchestration.retry",
    "processor.machine.saga": "processor._authoring.orchestration.saga",
    "processor.machine.spec": "processor._authoring.orchestration.spec",
    "processor.machine.states": "processor._authoring.orchestration.states",
    "processor.machine.stepping": "processor._authoring.orchestration.stepping",
    "processor.machine.steps": "processor._authoring.orchestration.steps",
    "processor.memory": "processor._memory",
    "processor.memory.audit": "processor._memory.audit",
    "processor.memory.consumer": "processor._memory.consumer",
    "processor.memory.deadlines": "processor._memory.deadlines",
    "processor.memory.growth": "processor._memory.growth",
    "processor.memory.outbox": "processor._memory.outbox",
    "processor.memory.participant": "processor._memory.participant",
    "processor.memory.participant_sqlite": "processor._memory.participant_sqlite",
    "processor.memory.producer": "processor._memory.producer",
    "processor.memory.retention": "processor._memory.retention",
    "processor.memory.store": "processor._memory.store",
    "processor.messages": "processor._authoring.messages",
    "processor.observe": "processor._observe",
    "processor.observe.health": "processor._observe.health",
    "processor.observe.logs": "processor._observe.logs",
    "processor.observe.metrics": "processor._observe.metrics",
    "processor.observe.repeats": "processor._observe.repeats",
    "processor.observe.sampler": "processor._observe.sampler",
    "processor.observe.server": "processor._observe.server",
    "processor.observe.tracing": "processor._observe.tracing",
    "processor.ops.batch": "processor.ops._batch",
    "processor.ops.check": "processor.ops._check",
    "processor.ops.contract": "processor.ops._contract",
    "processor.ops.deadlines": "processor.ops._deadlines",
    "processor.ops.diagram": "processor.ops._diagram",
    "processor.ops.filters": "processor.ops._filters",
    "processor.ops.inspect": "processor.ops._inspect",
    "processor.ops.machines": "processor.ops._machines",
    "processor.ops.outbox": "processor.ops._outbox",
    "processor.ops.parked": "processor.ops._parked",
    "processor.ops.progress": "processor.ops._progress",
    "processor.ops.topics": "processor.ops._topics",
    "processor.params": "processor._authoring.params",
    "processor.participant.definition": "processor._authoring.participant.definition",
    "processor.participant.handles": "processor._authoring.participant.handles",
    "processor.participant.kit": "processor._authoring.participant.kit",
    "processor.participant.rewind": "processor._authoring.participant.rewind",
    "processor.ports": "processor._ports",
    "processor.ports.cluster": "processor._ports.cluster",
    "processor.ports.deadlines": "processor._ports.deadlines",
    "processor.ports.engine": "processor._ports.consumer",
    "processor.ports.factory": "processor._ports.factory",
    "processor.ports.operator": "processor._ports.operator",
    "processor.ports.outbox": "processor._ports.outbox",
    "processor.ports.participant": "processor._ports.participant",
    "processor.ports.views": "processor._ports.views",
    "processor.postgres": "processor._postgres",
    "processor.postgres.audit": "processor._postgres.reads.audit",
    "processor.postgres.batch": "processor._postgres.batch.handle",
    "processor.postgres.batch_rows": "processor._postgres.batch.rows",
    "processor.postgres.batch_sql": "processor._postgres.batch.sql",
    "processor.postgres.check": "processor._postgres.reads.check",
    "processor.postgres.citus": "processor._postgres.schema.citus",
    "processor.postgres.citus_move": "processor._postgres.schema.citus_move",
    "processor.postgres.cluster": "processor._postgres.reads.cluster",
    "processor.postgres.connect": "processor._postgres.connect",
    "processor.postgres.ddl": "processor._postgres.schema.ddl",
    "processor.postgres.dead_letter_sql": "processor._postgres.dead_letter_sql",
    "processor.postgres.deadlines": "processor._postgres.deadlines",
    "processor.postgres.errors": "processor._postgres.errors",
    "processor.postgres.events": "processor._postgres.events",
    "processor.postgres.failed_outbox": "processor._postgres.failed_outbox",
    "processor.postgres.gauges": "processor._postgres.reads.gauges",
    "processor.postgres.growth": "processor._postgres.growth",
    "processor.postgres.held": "processor._postgres.held",
    "processor.postgres.inspect": "processor._postgres.reads.inspect",
    "processor.postgres.migrations": "processor._postgres.schema.runner",
    "processor.postgres.notify": "processor._postgres.notify",
    "processor.postgres.operator": "processor._postgres.reads.operator",
    "processor.postgres.operator_reads": "processor._postgres.batch.operator_reads",
    "processor.postgres.outbox": "processor._postgres.outbox",
    "processor.postgres.participant": "processor._postgres.participant",
    "processor.postgres.participant_schema": "processor._postgres.schema.participant",
    "processor.postgres.retention": "processor._postgres.retention",
    "processor.postgres.schema": "processor._postgres.schema.tables",
    "processor.postgres.store": "processor._postgres.batch.store",
    "processor.postgres.tls": "processor._postgres.tls",
    "processor.publish.kafka": "processor.publish._kafka",
    "processor.publish.outbox": "processor.publish._outbox",
    "processor.publish.records": "processor.publish._records",
    "processor.publish.relay": "processor.publish._relay",
    "processor.runner": "processor._invocation",
    "processor.runner.binder": "processor._invocation.binder",
    "processor.runner.bound": "processor._invocation.bound",
    "processor.runner.ids": "processor._invocation.ids",
    "processor.runner.inputs": "processor._invocation.inputs",
    "processor.runner.operator": "processor._invocation.operator",
    "processor.runner.state": "processor._invocation.state",
    "processor.runtime": "processor._runtime",
    "processor.runtime.access": "processor._runtime.consumer.access",
    "processor.runtime.assembly": "processor._runtime.assembly",
    "processor.runtime.availability": "processor._runtime.consumer.availability",
    "processor.runtime.batch": "processor._runtime.consumer.batch",
    "processor.runtime.growth": "processor._runtime.growth",
    "processor.runtime.heartbeat": "processor._runtime.heartbeat",
    "processor.runtime.hooks": "processor._runtime.hooks",
    "processor.runtime.intake": "processor._runtime.consumer.intake",
    "processor.runtime.isolate": "processor._runtime.consumer.isolate",
    "processor.runtime.lane": "processor._runtime.consumer.lane",
    "processor.runtime.loops": "processor._runtime.loops",
    "processor.runtime.observe": "processor._runtime.observe",
    "processor.runtime.ownership": "processor._runtime.consumer.ownership",
    "processor.runtime.participant": "processor._runtime.participant.service",
    "processor.runtime.participant_observe": "processor._runtime.participant.observe",
    "processor.runtime.placement": "processor._runtime.consumer.placement",
    "processor.runtime.poller": "processor._runtime.poller",
    "processor.runtime.processor": "processor._runtime.processor",
    "processor.runtime.recovery": "processor._runtime.consumer.recovery",
    "processor.runtime.relay": "processor._runtime.relay",
    "processor.runtime.report": "processor._runtime.report",
    "processor.runtime.resume": "processor._runtime.resume",
    "processor.runtime.retention": "processor._runtime.retention",
    "processor.runtime.stats": "processor._runtime.consumer.stats",
    "processor.runtime.steps": "processor._runtime.consumer.steps",
    "processor.runtime.stopping": "processor._runtime.stopping",
    "processor.runtime.supervisor": "processor._runtime.supervisor",
    "processor.runtime.worker": "processor._runtime.consumer.worker",
    "processor.settings.console": "processor.settings._console",
    "processor.settings.consumer": "processor.settings._consumer",
    "processor.settings.database": "processor.settings._database",
    "processor.settings.deadline": "processor.settings._deadline",
    "processor.settings.kafka": "processor.settings._kafka",
    "processor.settings.loading": "processor.settings._loading",
    "processor.settings.relay": "processor.settings._relay",
    "processor.settings.retention": "processor.settings._retention",
    "processor.settings.service": "processor.settings._service",
    "processor.settings.values": "processor.settings._values",
    "processor.testing.engine": "processor.testing._engine",
    "processor.testing.participant": "processor.testing._participant",
    "processor.testing.result": "processor.testing._result",
    "processor.testing.saga": "processor.testing._saga",
    "processor.upcasting": "processor._authoring.upcasting",
    "processor.wire": "processor._wire",
}

# Where the public names of an old module are now, when that is not its new (internal) home.
_PUBLIC = {
    "processor.application": "processor",
    "processor.definition": "processor",
    "processor.errors": "processor",
    "processor.handles": "processor",
    "processor.machine": "processor",
    "processor.messages": "processor",
    "processor.upcasting": "processor",
    "processor.participant.": "processor.participant",
    "processor.ops.": "processor.ops",
    "processor.publish.": "processor.publish",
    "processor.settings.": "processor.settings",
    "processor.testing.": "processor.testing",
}


def new_path(old: str) -> str | None:
    """The path of the module ``old`` names now, or None when ``old`` is not an old path.

    A module below an old package path maps below its new one, so the package's module is
    found, never loaded a second time under the old name.
    """
    parts = old.split(".")
    for n in range(len(parts), 1, -1):
        head = ".".join(parts[:n])
        if head in MOVED:
            return ".".join([MOVED[head], *parts[n:]])
    return None


def message(old: str, new: str) -> str:
    """The deprecation warning for an import of ``old``, now at ``new``."""
    text = f"{old} is deprecated; import {new}"
    public = next(
        (v for k, v in _PUBLIC.items() if old == k or (k.endswith(".") and old.startswith(k))),
        None,
    )
    return text if public is None else f"{text} (its public names are in {public})"


def _stacklevel() -> int:
    """The ``stacklevel`` that points a warning of :meth:`_Renamed.create_module` at the import.

    That is the import statement, or importlib.import_module's caller. The warnings module skips
    the import system's bootstrap frames by itself without counting them; this module's frames
    and importlib.import_module's count.
    """
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            if name not in (__file__, importlib.__file__):
                return level
            level += 1
        frame = frame.f_back
    return level


class _Renamed(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds old module paths; loads each as the module at its new path."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_path(fullname)
        if new is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self)
        spec.loader_state = [new, None]
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        state = spec.loader_state
        module = importlib.import_module(state[0])
        # The import system is about to set this spec on the module: exec_module puts the
        # module's own back.
        state[1] = module.__spec__
        warnings.warn(message(spec.name, state[0]), DeprecationWarning, stacklevel=_stacklevel())
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None and spec.loader is self:
            module.__spec__ = spec.loader_state[1]


_FINDER = _Renamed()


def install() -> None:
    """Puts the finder of old paths first in :data:`sys.meta_path` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
