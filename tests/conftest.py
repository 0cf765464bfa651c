"""Session-wide fixtures: real services, and per-test topics and database schemas."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from devstack import Registry, Services, provide, provide_registry
from tests.sim.budget import SEED_BASE as SIM_SEED_BASE
from tests.support.phases import CITUS_LAYOUT, PHASE, PHASES, citus_layouts, kept, longest_first
from tests.support.roles import LeastPrivilege, least_privilege

# A hang with the interpreter held still ends the run, with every thread's stack; a failed
# test that ran processes shows what they said.
pytest_plugins = ["tests.support.hang_watchdog", "tests.support.tell"]


def pytest_configure(config: pytest.Config) -> None:
    # The simulation's new seeds (tests/sim): drawn once, before pytest-xdist starts its
    # workers, which inherit the variable; set it to run a former run's seeds again.
    if not os.environ.get(SIM_SEED_BASE):
        os.environ[SIM_SEED_BASE] = str(secrets.randbelow(10**9))


def pytest_report_header(config: pytest.Config) -> str:
    return f"simulation seeds from {SIM_SEED_BASE}={os.environ[SIM_SEED_BASE]}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phase = os.environ.get(PHASE)
    if phase not in (*PHASES, "citus"):
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        (keep if kept(item, phase) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    # The end-to-end phase hands whole files out in this order (tests.run turns pytest-xdist's
    # own order off there): what takes longest goes first, so that no worker is left with it
    # at the end.
    items[:] = longest_first(keep, config.rootpath)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The Citus phase runs some files once per layout of the processors' tables.
    if os.environ.get(PHASE) != "citus":
        return
    layouts = citus_layouts(metafunc.definition.path, metafunc.config.rootpath)
    if layouts:
        metafunc.parametrize("citus_layout", layouts, indirect=True)


@pytest.fixture(autouse=True)
def citus_layout(request: pytest.FixtureRequest) -> str | None:
    """The layout of the tables of the processors this test starts, where the Citus phase
    gives one (``tests.support.phases.CITUS_LAYOUTS``): ``settings_for`` reads it. Elsewhere
    :data:`CITUS_LAYOUT` stays as the run's environment has it."""
    layout: str | None = getattr(request, "param", None)
    if layout is not None:
        monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
        if layout == "buckets":
            monkeypatch.setenv(CITUS_LAYOUT, layout)
        else:
            monkeypatch.delenv(CITUS_LAYOUT, raising=False)
    return layout


def _past_capture(request: pytest.FixtureRequest) -> Callable[[str], None]:
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def echo(line: str) -> None:
        # Past pytest's capture: how long the stack took to be ready belongs in every run's log.
        if capture is None:
            print(line)
            return
        with capture.global_and_fixture_disabled():
            print(line, flush=True)

    return echo


@pytest.fixture(scope="session")
def services(request: pytest.FixtureRequest) -> Iterator[Services]:
    echo = _past_capture(request)
    with provide(echo) as found:
        yield found
        _wait_for_consumer_closes(echo)


def _wait_for_consumer_closes(echo: Callable[[str], None], timeout: float = 120.0) -> None:
    """Lets consumer closes that in-process processors left running end before the broker stops.

    A processor's stop leaves a close that outlasts its deadline running in the background (a
    rebalance in its group can hold it). If the broker then goes away, librdkafka calls the
    revocation back inside that close, and confluent-kafka holds the GIL through the unassign
    that follows: a wait there would stop every thread of the test run.
    """
    closing = [t for t in threading.enumerate() if t.name == "consumer-close" and t.is_alive()]
    if not closing:
        return
    echo(f"waiting up to {timeout:.0f} s for {len(closing)} consumer close(s) left running")
    ends = time.monotonic() + timeout
    for t in closing:
        t.join(max(0.0, ends - time.monotonic()))
    left = sum(t.is_alive() for t in closing)
    echo(f"{left} consumer close(s) still running" if left else "consumer closes ended")


@pytest.fixture(scope="session")
def schema_registry(request: pytest.FixtureRequest) -> Iterator[Registry]:
    """A Schema Registry: `SAGA_TEST_SCHEMA_REGISTRY_URL` (which `make test` sets), else the
    local one, started here for the session.

    `stop` and `start` are set only when the run started it (its schemas survive them). A test
    that uses them takes the registry away from every other test of the run: mark it serial.
    """
    with provide_registry(_past_capture(request)) as registry:
        yield registry


@pytest.fixture(scope="session")
def schema_registry_url(schema_registry: Registry) -> str:
    """The registry's Confluent-compatible API."""
    return schema_registry.url


@pytest.fixture(scope="session")
def kafka_bootstrap(services: Services) -> str:
    return services.kafka_bootstrap


@pytest.fixture(scope="session")
def database_url(services: Services) -> str:
    return services.database_url


def _slug(request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:30].strip("_")
    return f"{name}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_topic(
    kafka_bootstrap: str, request: pytest.FixtureRequest
) -> Iterator[Callable[..., str]]:
    """Creates topics that only this test sees; deletes them afterwards."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    from tests.support.harness import until_visible

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    created: list[str] = []

    def make(suffix: str = "t", partitions: int = 1) -> str:
        name = f"{_slug(request)}.{suffix}"
        futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)
        for future in futures.values():
            future.result()
        created.append(name)
        until_visible(admin, [name])
        return name

    yield make
    if created:
        for future in admin.delete_topics(created, operation_timeout=30).values():
            # The broker may have been restarted by the test; leftovers are harmless.
            with contextlib.suppress(Exception):
                future.result()


@pytest.fixture
def pg_schema(database_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database schema that only this test sees; dropped afterwards."""
    name = f"t_{_slug(request)}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def least_privilege_db(
    database_url: str, request: pytest.FixtureRequest
) -> Iterator[LeastPrivilege]:
    """This test's schema, migrated by an owner role; the processor runs as a runtime role with
    only the grants of deploy/sql/grants.sql. Roles and schema are dropped afterwards."""
    with least_privilege(database_url, f"t_{_slug(request)}") as granted:
        yield granted
