"""The application object: one importable value that names everything a processor process runs.

Users define it in their own module and point the command line at it, the way uvicorn runs
`main:app`::

    # myapp/service.py
    app = SagaApp(
        sagas=[TransferSaga],
        dependencies={Clock: SystemClock()},
        factories={Ledger: open_ledger},  # called once per process, closed on shutdown
        settings={"settings": {"transfer.max-amount": 500}},
    )

    $ saga-processor run myapp.service:app

This module imports no Kafka or PostgreSQL client: defining an app stays cheap to import and test.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from processor._errors import ConfigurationError, SagaError

if TYPE_CHECKING:
    from processor.settings import ProcessorSettings

__all__ = [
    "APP_VARIABLE",
    "Factory",
    "ParticipantApp",
    "SagaApp",
    "app_target",
    "load_app",
    "load_participant_app",
]

log = logging.getLogger(__name__)

Factory = Callable[[], object]
"""Builds one dependency; may return a context manager, which is entered and closed on shutdown."""


class _Unbuilt:
    """Stands for a factory's product while the handlers' parameters are checked."""


class SagaApp:
    """The sagas a processor runs, the dependencies their handlers ask for, and settings.

    Dependencies are resolved by declared type, as `build_processor(dependencies=...)` does:
    a handler parameter annotated `Ledger` receives the object registered under `Ledger` (or
    under one subclass of it). Every handler parameter is checked when a process starts, before
    any factory runs and before any record is read.

    Settings given here are defaults: `SAGA_*` environment variables override them.

    Attributes:
        sagas: The saga classes, in the order given.
        dependencies: Objects injected as they are; the app never closes them.
        factories: Callables building one dependency each, once per process. When a factory
            returns a context manager, it is entered (its `__enter__` result is the dependency)
            and exited when the process shuts down, in the reverse order of building.
        settings: Processor settings under the environment's, as a mapping of
            `ProcessorSettings` fields (nested mappings for nested settings).
        participants: Participants the same process also runs, for small deployments: a
            participant service (`SAGA_PARTICIPANT__*`) beside the processor, sharing its
            dependencies; empty for none.
    """

    def __init__(
        self,
        *,
        sagas: Iterable[type[Any]],
        dependencies: Mapping[type, object] | None = None,
        factories: Mapping[type, Factory] | None = None,
        settings: ProcessorSettings | Mapping[str, Any] | None = None,
        participants: Iterable[object] = (),
        participant_migrations: Iterable[str] = (),
    ) -> None:
        """Defines an application.

        Args:
            sagas: Saga classes (decorated with `@saga`, or state machine sagas).
            dependencies: Ready objects by the type handlers declare.
            factories: Builders of dependencies by the type handlers declare.
            settings: A `ProcessorSettings`, or a mapping of its fields; the environment wins.
            participants: Participants to run in the same process (see the attribute).
            participant_migrations: Their service's own DDL, as `ParticipantApp(migrations=)`.

        Raises:
            ConfigurationError: A type is both a dependency and a factory, or no saga is given.
        """
        self.sagas: tuple[type[Any], ...] = tuple(sagas)
        self.participants: tuple[object, ...] = tuple(participants)
        self.participant_migrations: tuple[str, ...] = tuple(participant_migrations)
        self.dependencies: dict[type, object] = dict(dependencies or {})
        self.factories: dict[type, Factory] = dict(factories or {})
        self.settings = _settings_mapping(settings)
        problems = _both(self.dependencies, self.factories)
        if not self.sagas:
            problems.append("SagaApp(sagas=...) names no saga")
        if problems:
            raise ConfigurationError(problems)

    def __repr__(self) -> str:
        names = ", ".join(c.__qualname__ for c in self.sagas)
        return f"SagaApp(sagas=[{names}])"

    def provided(self) -> dict[type, object]:
        """Every type the app provides, each with its object or a placeholder for a factory."""
        return {**self.dependencies, **{t: _Unbuilt() for t in self.factories}}

    def check(self, settings: ProcessorSettings) -> None:
        """Binds every handler against what the app provides, building nothing.

        Raises:
            ConfigurationError: Every handler parameter that nothing provides (naming the saga,
                the handler and the type), every missing setting, in one error.
        """
        from processor._authoring.definition import definition_of
        from processor._invocation import bind_all

        bind_all(
            [definition_of(c) for c in self.sagas],
            settings=settings.settings,
            dependencies=self.provided(),
        )
        if self.participants:
            from processor._authoring.participant.kit import bind_participants

            bind_participants(self.participants, settings.settings, self.provided())

    def hosted(self) -> ParticipantApp | None:
        """The participants this app runs beside its sagas, as their own app; None if none."""
        if not self.participants:
            return None
        return ParticipantApp(
            participants=self.participants,
            dependencies=self.dependencies,
            migrations=self.participant_migrations,
        )

    @contextmanager
    def open(self, settings: ProcessorSettings) -> Iterator[dict[type, object]]:
        """Checks the handlers, builds the dependencies, and closes them on leaving.

        Yields:
            Every dependency by type: the ready objects and what the factories built.

        Raises:
            ConfigurationError: As :meth:`check`; raised before any factory runs.
        """
        self.check(settings)
        with _built(self.dependencies, self.factories) as built:
            yield built


class ParticipantApp:
    """The participants a service runs, the dependencies their handlers ask for, and settings.

    The counterpart of :class:`SagaApp` for the services that answer a saga's commands::

        # inventory/service.py
        app = ParticipantApp(
            participants=[Inventory],
            factories={Warehouse: open_warehouse},
            settings={"participant": {"schema_name": "inventory"}},
        )

        $ saga-processor participant run inventory.service:app

    Handlers get their dependencies by declared type; factories run once per process and what
    they return as a context manager is closed on shutdown. Settings given here are defaults
    under the `SAGA_*` environment (`SAGA_KAFKA__*`, `SAGA_DATABASE__URL`,
    `SAGA_PARTICIPANT__SCHEMA_NAME`, `SAGA_PARTICIPANT__GROUP_ID`, ...).

    Attributes:
        participants: Participant classes (created without arguments) or instances.
        migrations: The service's own DDL scripts, applied once each, in order.
        dependencies: Objects injected as they are; the app never closes them.
        factories: Callables building one dependency each, once per process.
        settings: Settings under the environment's, as a mapping of `ProcessorSettings` fields.
    """

    def __init__(
        self,
        *,
        participants: Iterable[object],
        dependencies: Mapping[type, object] | None = None,
        factories: Mapping[type, Factory] | None = None,
        settings: ProcessorSettings | Mapping[str, Any] | None = None,
        migrations: Iterable[str] = (),
    ) -> None:
        """Defines a participant service.

        Args:
            participants: Participant classes (created without arguments) or instances.
            dependencies: Ready objects by the type handlers declare.
            factories: Builders of dependencies by the type handlers declare.
            settings: A `ProcessorSettings`, or a mapping of its fields; the environment wins.
            migrations: The service's own tables, as DDL scripts applied once each, in order,
                in its schema (`participant migrate`, and at every start); append, never edit.

        Raises:
            ConfigurationError: A type is both a dependency and a factory, or no participant
                is given.
        """
        self.participants: tuple[object, ...] = tuple(participants)
        self.migrations: tuple[str, ...] = tuple(migrations)
        self.dependencies: dict[type, object] = dict(dependencies or {})
        self.factories: dict[type, Factory] = dict(factories or {})
        self.settings = _settings_mapping(settings)
        problems = _both(self.dependencies, self.factories)
        if not self.participants:
            problems.append("ParticipantApp(participants=...) names no participant")
        if problems:
            raise ConfigurationError(problems)

    def __repr__(self) -> str:
        names = ", ".join(_name(p if isinstance(p, type) else type(p)) for p in self.participants)
        return f"ParticipantApp(participants=[{names}])"

    def check(self, settings: ProcessorSettings) -> None:
        """Binds every command handler against what the app provides, building nothing.

        Raises:
            ConfigurationError: Every handler parameter nothing provides, in one error.
        """
        from processor._authoring.participant.kit import bind_participants

        provided = {**self.dependencies, **{t: _Unbuilt() for t in self.factories}}
        bind_participants(self.participants, settings.settings, provided)

    @contextmanager
    def open(self, settings: ProcessorSettings) -> Iterator[dict[type, object]]:
        """Checks the handlers, builds the dependencies, and closes them on leaving."""
        self.check(settings)
        with _built(self.dependencies, self.factories) as built:
            yield built


def _both(dependencies: Mapping[type, object], factories: Mapping[type, Factory]) -> list[str]:
    return [
        f"{_name(t)} is given both as a dependency and as a factory; keep one"
        for t in dependencies.keys() & factories.keys()
    ]


@contextmanager
def _built(
    dependencies: Mapping[type, object], factories: Mapping[type, Factory]
) -> Iterator[dict[type, object]]:
    with ExitStack() as stack:
        built = dict(dependencies)
        for kind, factory in factories.items():
            made = factory()
            if isinstance(made, AbstractContextManager):
                stack.callback(log.info, "closed dependency %s", _name(kind))
                made = stack.enter_context(made)
            built[kind] = made
        yield built


def _settings_mapping(settings: ProcessorSettings | Mapping[str, Any] | None) -> dict[str, Any]:
    if settings is None:
        return {}
    if isinstance(settings, Mapping):
        return dict(settings)
    # Only what was set explicitly, so that the environment fills in the rest; secrets stay
    # SecretStr objects in this dump, never plain text.
    dumped: dict[str, Any] = settings.model_dump(exclude_unset=True, by_alias=True)
    return dumped


def _name(kind: type) -> str:
    return getattr(kind, "__qualname__", repr(kind))


APP_VARIABLE = "SAGA_APP"
"""Names the application object when the command line does not."""


def app_target(given: str | None = None) -> str | None:
    """The application target: `given` (from the command line), else `SAGA_APP`, else None."""
    return given or os.environ.get(APP_VARIABLE) or None


def load_app(target: str) -> SagaApp:
    """Imports `MODULE:ATTR` and returns the `SagaApp` it names.

    `ATTR` may be dotted (`service:container.app`) and may name a callable taking no arguments
    that returns the app (an app factory). The working directory is importable, as it is for
    `python -m` and for uvicorn, so `saga-processor run main:app` finds `./main.py`.

    Raises:
        SagaError: The target is malformed, cannot be imported, or is not a `SagaApp`.
    """
    found = _load(target)
    if not isinstance(found, SagaApp):
        raise SagaError(
            f"{target} is a {type(found).__name__}, not a SagaApp; "
            "define app = processor.SagaApp(sagas=[...]) there"
        )
    return found


def load_participant_app(target: str) -> ParticipantApp:
    """Imports `MODULE:ATTR` and returns the `ParticipantApp` it names (as :func:`load_app`).

    Raises:
        SagaError: The target is malformed, cannot be imported, or is not a `ParticipantApp`.
    """
    found = _load(target)
    if not isinstance(found, ParticipantApp):
        raise SagaError(
            f"{target} is a {type(found).__name__}, not a ParticipantApp; "
            "define app = processor.ParticipantApp(participants=[...]) there"
        )
    return found


def import_target(target: str, malformed: str, what: str = "") -> Any:
    """The object ``MODULE:ATTR`` names (ATTR may be dotted), imported from the working directory.

    Raises:
        SagaError: ``malformed`` when the target is not ``MODULE:ATTR``; otherwise the import or
            attribute error, named.
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SagaError(malformed)
    try:
        found: Any = import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise SagaError(f"cannot load {what}{target!r}: {type(e).__name__}: {e}") from e
    return found


def import_module(name: str) -> Any:
    """The module ``name``, found in the working directory too, as `python -m` would.

    Every command that names user code (`run`, `diagram`, `SAGA_SAGAS`) finds it the same way.
    """
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def _load(target: str) -> Any:
    found = import_target(
        target, f"name the app as MODULE:ATTR, e.g. myapp.service:app; got {target!r}", "app "
    )
    apps = (SagaApp, ParticipantApp)
    if not isinstance(found, apps) and callable(found) and not isinstance(found, type):
        found = found()
    return found
