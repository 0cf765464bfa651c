"""bind() resolves settings and dependencies at startup and lists every problem at once."""

from datetime import timedelta
from typing import Annotated

import pytest

from processor import (
    ConfigurationError,
    Message,
    SagaCommands,
    SagaState,
    Setting,
    message_type,
    saga,
    saga_deadline_handler,
    saga_event_handler,
)
from processor._authoring.binding import lookup_setting
from processor._invocation import bind, bind_all


@message_type("test.binding.Started")
class Started(Message):
    job_id: str


class Unregistered(Message):
    job_id: str


class Mailer:
    pass


class SmtpMailer(Mailer):
    pass


class Ledger:
    pass


class Note(Message):
    text: str


@saga(type="needs-config")
class NeedsConfig(SagaState):
    @saga_event_handler(Started, association_property="job_id", start=True)
    def started(
        self,
        event: Started,
        limit: Annotated[int, Setting("jobs.limit")],
        mailer: Mailer,
        timeout: Annotated[timedelta, Setting("jobs.timeout", default=timedelta(minutes=5))],
    ) -> None: ...

    @saga_deadline_handler("tick")
    def tick(
        self,
        commands: SagaCommands,
        token: Annotated[str, Setting("jobs.token")],
        ledger: Ledger,
        note: Note | None = None,
    ) -> None: ...


def _resolved(bound: object, handler: str) -> dict[str, object]:
    return {r.param.name: r.value for r in bound._resolved[handler] if r.constant}  # type: ignore[attr-defined]


def test_every_missing_setting_and_dependency_is_listed() -> None:
    with pytest.raises(ConfigurationError) as info:
        bind(NeedsConfig)
    problems = info.value.problems
    assert problems == [
        "handler started: setting 'jobs.limit' is missing; configure it",
        "handler started: parameter 'mailer' needs a dependency of type Mailer; provide one in "
        "the app: SagaApp(dependencies={Mailer: ...}) or factories=",
        "handler tick: setting 'jobs.token' is missing; configure it",
        "handler tick: parameters 'ledger', 'note' are neither handles, settings nor registered "
        "dependencies; a deadline handler takes at most one payload parameter, so register the "
        "others as dependencies",
    ]
    assert "saga 'needs-config'" in str(info.value)


def test_complete_configuration_binds_and_uses_defaults() -> None:
    mailer, ledger = SmtpMailer(), Ledger()
    bound = bind(
        NeedsConfig,
        settings={"jobs": {"limit": "7"}, "jobs.token": "s3cret"},
        dependencies={SmtpMailer: mailer, Ledger: ledger},
    )
    assert bound.saga_type == "needs-config"
    assert _resolved(bound, "started") == {
        "limit": 7,
        "mailer": mailer,
        "timeout": timedelta(minutes=5),
    }
    tick = {r.param.name: r for r in bound._resolved["tick"]}
    assert tick["ledger"].constant
    assert tick["ledger"].param.kind == "dependency"
    assert tick["note"].param.kind == "payload"
    assert tick["note"].adapter is not None


def test_configured_value_overrides_the_default_and_is_validated() -> None:
    bound = bind(
        NeedsConfig,
        settings={"jobs.limit": 1, "jobs.timeout": "PT90S", "jobs.token": "t"},
        dependencies={Mailer: Mailer(), Ledger: Ledger()},
    )
    assert _resolved(bound, "started")["timeout"] == timedelta(seconds=90)


def test_invalid_setting_is_reported_without_echoing_the_value() -> None:
    with pytest.raises(ConfigurationError) as info:
        bind(
            NeedsConfig,
            settings={"jobs.limit": "hunter2-not-a-number", "jobs.token": "t"},
            dependencies={Mailer: Mailer(), Ledger: Ledger()},
        )
    assert len(info.value.problems) == 1
    assert "setting 'jobs.limit' is invalid" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_ambiguous_dependency_is_a_problem() -> None:
    class OtherMailer(Mailer):
        pass

    with pytest.raises(ConfigurationError, match="matches 2 dependencies"):
        bind(
            NeedsConfig,
            settings={"jobs.limit": 1, "jobs.token": "t"},
            dependencies={SmtpMailer: SmtpMailer(), OtherMailer: OtherMailer(), Ledger: Ledger()},
        )


@message_type("test.binding.Other")
class Other(Message):
    job_id: str


@saga(type="optional-deps")
class OptionalDeps(SagaState):
    @saga_event_handler(Other, association_property="job_id", start=True)
    def started(
        self,
        event: Other,
        mailer: Mailer | None,
        retries: Annotated[int, Setting("jobs.retries")] = 3,
    ) -> None: ...


def test_optional_dependency_and_parameter_default() -> None:
    bound = bind(OptionalDeps)
    assert _resolved(bound, "started") == {"mailer": None, "retries": 3}


def test_bind_all_aggregates_problems_and_rejects_duplicate_types() -> None:
    @saga(type="optional-deps")
    class SameName(SagaState):
        @saga_event_handler(Other, association_property="job_id", start=True)
        def started(self, event: Other) -> None: ...

    with pytest.raises(ConfigurationError) as info:
        bind_all([OptionalDeps, NeedsConfig, SameName])
    text = str(info.value)
    assert "share the type 'optional-deps'" in text
    assert "saga 'needs-config': handler started: setting 'jobs.limit' is missing" in text
    assert len(info.value.problems) == 5

    bound = bind_all([OptionalDeps])
    assert list(bound) == ["optional-deps"]


def test_unregistered_event_class_cannot_be_bound() -> None:
    @saga(type="unregistered")
    class UsesUnregistered(SagaState):
        @saga_event_handler(Unregistered, association_property="job_id", start=True)
        def started(self, event: Unregistered) -> None: ...

    with pytest.raises(ConfigurationError, match="Unregistered is not registered"):
        bind(UsesUnregistered)


def test_lookup_setting_flat_nested_and_absent() -> None:
    settings = {"a.b": 1, "x": {"y": {"z": 2}}}
    assert lookup_setting(settings, "a.b") == 1
    assert lookup_setting(settings, "x.y.z") == 2
    missing = lookup_setting(settings, "x.q")
    assert missing is lookup_setting(settings, "nope")
    assert missing is not None


def test_a_processor_without_sagas_is_refused_by_name() -> None:
    from processor._errors import ConfigurationError
    from processor._runtime.assembly import bind_sagas
    from processor.settings import ProcessorSettings

    settings = ProcessorSettings(database={"url": "postgresql://unused"}, sagas=[])
    with pytest.raises(ConfigurationError, match="no saga configured"):
        bind_sagas(settings)


def test_a_missing_value_type_suggests_a_setting_and_a_participant_names_its_app() -> None:
    from processor._authoring.binding import _missing
    from processor._authoring.params import NO_DEFAULT, Param

    wait = Param("wait", "dependency", timedelta, None, False, NO_DEFAULT)
    text = _missing("handler h", wait, "ParticipantApp")
    assert "ParticipantApp(dependencies={timedelta: ...})" in text
    assert "or, for a configured value, Annotated[timedelta, Setting('some.key')]" in text
    clock = Param("clock", "dependency", Ledger, None, False, NO_DEFAULT)
    assert "Setting(" not in _missing("handler h", clock, "SagaApp")
