"""SagaApp: dependencies checked before anything is built, factories closed, settings layered."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from processor import SagaApp, SagaLifecycle, SagaState, saga, saga_event_handler
from processor._authoring.application import load_app
from processor._errors import ConfigurationError, SagaError
from processor.settings import load_settings
from tests.e2e.gated_app import JobRequested

URL = "postgresql://u@h/db"


class Clock:
    pass


class Store:
    def __init__(self) -> None:
        self.closed = False


@saga(type="unit.app-saga")
class NeedsBoth(SagaState):
    @saga_event_handler(JobRequested, association_property="job_id", start=True)
    def go(self, event: JobRequested, clock: Clock, store: Store, life: SagaLifecycle) -> None:
        life.end()


def test_factories_are_built_once_and_closed_in_reverse_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAGA_DATABASE__URL", URL)
    events: list[str] = []

    @contextmanager
    def store() -> Iterator[Store]:
        events.append("store open")
        yield Store()
        events.append("store closed")

    def clock() -> Clock:
        events.append("clock built")
        return Clock()

    app = SagaApp(sagas=[NeedsBoth], factories={Clock: clock, Store: store})
    with app.open(load_settings()) as deps:
        assert isinstance(deps[Clock], Clock)
        assert isinstance(deps[Store], Store)
        assert events == ["clock built", "store open"]
    assert events == ["clock built", "store open", "store closed"]


def test_a_missing_type_is_refused_before_any_factory_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAGA_DATABASE__URL", URL)
    built: list[str] = []

    def store() -> Store:
        built.append("store")
        return Store()

    app = SagaApp(sagas=[NeedsBoth], factories={Store: store})
    with pytest.raises(ConfigurationError) as info, app.open(load_settings()):
        pass
    assert built == []
    assert (
        "saga 'unit.app-saga': handler go: parameter 'clock' needs a dependency of type Clock"
        in str(info.value)
    )


def test_environment_overrides_the_app_settings_key_by_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = SagaApp(
        sagas=[NeedsBoth],
        settings={
            "database": {"url": URL, "schema_name": "from_app"},
            "topic_prefix": "app.",
            "settings": {"a": 1, "b": 2},
        },
    )
    monkeypatch.setenv("SAGA_DATABASE__SCHEMA_NAME", "from_env")
    monkeypatch.setenv("SAGA_SETTINGS", '{"b": 3}')
    settings = load_settings(defaults=app.settings)
    assert settings.database.url.get_secret_value() == URL
    assert settings.database.schema_name == "from_env"
    assert settings.topic_prefix == "app."
    assert settings.settings == {"a": 1, "b": 3}


def test_load_app_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(SagaError, match="MODULE:ATTR"):
        load_app("tests.e2e.gated_app")
    with pytest.raises(SagaError, match="cannot load app"):
        load_app("tests.e2e.gated_app:nope")
    with pytest.raises(SagaError, match="not a SagaApp"):
        load_app("tests.e2e.gated_app:EVENTS")
    assert load_app("tests.e2e.gated_app:app").sagas[0].__name__ == "GatedJob"


def test_a_type_given_twice_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="both as a dependency and as a factory"):
        SagaApp(sagas=[NeedsBoth], dependencies={Clock: Clock()}, factories={Clock: Clock})
