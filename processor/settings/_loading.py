"""The processor's settings as a whole, and reading them once from `SAGA_*` variables.

A misspelt `SAGA_*` name is refused, a retired one is warned about, and a bad value is reported
by the variable that holds it, never by its value.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from processor._errors import ConfigurationError
from processor.settings._console import ConsoleSettings, OperatorSettings
from processor.settings._consumer import ConsumerSettings
from processor.settings._database import DatabaseSettings
from processor.settings._deadline import DeadlineSettings
from processor.settings._kafka import KafkaSettings, TopicsSettings
from processor.settings._registry import SchemaRegistrySettings
from processor.settings._relay import RelaySettings
from processor.settings._retention import HistorySettings, RetentionSettings
from processor.settings._service import MetricsSettings, ParticipantSettings
from processor.settings._values import Duration

__all__ = [
    "ALLOWED_NAMES",
    "ALLOWED_PREFIXES",
    "RETIRED",
    "ProcessorSettings",
    "load_settings",
    "unknown_variables",
]

# Under the package's name, the one log configurations select settings warnings by.
_log = logging.getLogger("processor.settings")


class ProcessorSettings(BaseSettings):
    """Everything the processor needs, from `SAGA_*` variables (nested with `__`)."""

    model_config = SettingsConfigDict(
        env_prefix="SAGA_", env_nested_delimiter="__", extra="ignore", populate_by_name=True
    )

    # Saga classes to run, as `module:Class` or a module exposing `EXAMPLE_SAGAS`/`SAGAS`.
    # No default: the processor refuses to start without one (see assembly.bind_sagas).
    sagas: list[str] = Field(default_factory=list)
    # Values for handler parameters declared as `Annotated[T, Setting("key")]`.
    settings: dict[str, Any] = Field(default_factory=dict)
    instance_id: str | None = None
    # Prepended to every topic the processor reads or writes (e.g. "staging.").
    topic_prefix: str = ""
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    topics: TopicsSettings = Field(default_factory=TopicsSettings)
    database: DatabaseSettings
    consumer: ConsumerSettings = Field(default_factory=ConsumerSettings)
    relay: RelaySettings = Field(default_factory=RelaySettings)
    deadline: DeadlineSettings = Field(default_factory=DeadlineSettings)
    history: HistorySettings = Field(default_factory=HistorySettings)
    operator: OperatorSettings = Field(default_factory=OperatorSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    shutdown_timeout: Duration = timedelta(seconds=20)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    participant: ParticipantSettings = Field(default_factory=ParticipantSettings)
    schema_registry: SchemaRegistrySettings = Field(default_factory=SchemaRegistrySettings)
    # Read by the command line only (it configures logging): `text` for a terminal, `json` for
    # a log pipeline. A setting, so that a misspelt value is refused like any other.
    log_format: Literal["text", "json"] = "text"

    @model_validator(mode="after")
    def _decided_outlive_expiry(self) -> ProcessorSettings:
        # An operator record refused or met with no saga is recognised when sent again by its
        # history row, which retention purges after retention.history; past its expiry a copy
        # is refused anyway. A purge inside that window would let the copy be decided again.
        if self.retention.enabled and self.retention.history <= self.operator.expiry * 2:
            raise ValueError(
                f"retention.history ({self.retention.history}) must be more than twice "
                f"operator.expiry ({self.operator.expiry}): refused operator requests must "
                "stay recognised until they expire"
            )
        return self


# `SAGA_*` variables that are not settings but belong to the tools around the processor: the
# test suite, its fault injection, and the local stack scripts. Anything else unknown is a typo.
ALLOWED_PREFIXES = ("SAGA_TEST_", "SAGA_FAULT_")
ALLOWED_NAMES = frozenset(
    {
        "SAGA_LOCAL_DIR",
        "SAGA_CACHE_DIR",
        "SAGA_KAFKA_PORT",
        "SAGA_KAFKA_CONTROLLER_PORT",
        "SAGA_KAFKA_ADVERTISED_PORT",
        "SAGA_PG_PORT",
        "SAGA_PG_CLUSTER",
        "SAGA_LOCAL_PG_FSYNC",
        "SAGA_LOCAL_PG_SSL",
        "SAGA_CITUS_PORT",
        "SAGA_REGISTRY_PORT",
        "SAGA_REGISTRY_MANAGEMENT_PORT",
        "SAGA_REGISTRY_JAVA",
        "SAGA_REGISTRY_STORAGE",
        # The application object (`MODULE:ATTR`) the command line loads; read by processor._cli.
        "SAGA_APP",
    }
)


def _known(model: type[BaseModel], path: tuple[str, ...]) -> bool:
    """Whether `path` (lower-case names split at `__`) names a field of `model` or inside it."""
    if not path:
        return True
    for name, field in model.model_fields.items():
        if path[0] not in {name, field.alias}:
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return _known(annotation, path[1:])
        origin = getattr(annotation, "__origin__", None)
        # A dict setting takes any key (librdkafka properties, handler settings).
        return origin is dict or len(path) == 1
    return False


# Settings that no longer exist, and why: accepted with a warning rather than refused as a typo,
# so that an upgrade does not stop on a value set for an older version.
RETIRED = {
    "SAGA_CONSUMER__GROWTH_GRACE": (
        "new partitions no longer wait a grace after a growth: each of their records waits for "
        "the old partitions to be consumed past it (docs/operations.md, Adding partitions online)"
    ),
}


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The `SAGA_*` names in `environ` that no setting reads and no tool owns, sorted.

    Args:
        environ: Environment variables, e.g. `os.environ`.

    Returns:
        Each name that would otherwise be silently ignored (usually a misspelt setting).
    """
    unknown = []
    for name in environ:
        upper = name.upper()
        if not upper.startswith("SAGA_") or upper in ALLOWED_NAMES or upper in RETIRED:
            continue
        if upper.startswith(ALLOWED_PREFIXES):
            continue
        path = tuple(upper.removeprefix("SAGA_").lower().split("__"))
        if not _known(ProcessorSettings, path):
            unknown.append(name)
    return sorted(unknown)


def _problem(err: Any) -> str:
    loc = tuple(str(p) for p in err["loc"])
    if err["type"] == "missing" and loc in {("database",), ("database", "url")}:
        return (
            "SAGA_DATABASE__URL: required, e.g. "
            "postgresql://saga_runtime@db.example.com:5432/saga?sslmode=verify-full"
        )
    return f"SAGA_{'__'.join(p.upper() for p in loc)}: {err['msg']}"


def load_settings(
    environ: Mapping[str, str] | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> ProcessorSettings:
    """Reads the environment once; a bad value is a ConfigurationError naming the variable.

    The error says where and what, never the value: pydantic's input echo may carry secrets, so
    neither its text nor the original exception (as a cause or context) goes with it.

    Args:
        environ: Checked for misspelt `SAGA_*` names; defaults to `os.environ` (which is also
            where the values are read from).
        defaults: Settings the application object gives (`SagaApp(settings=...)`): the
            environment overrides them, key by key in nested settings.
        **overrides: Settings given directly, ahead of the environment.

    Raises:
        ConfigurationError: A value is invalid or missing, or a `SAGA_*` name is unknown.
    """
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    seen = os.environ if environ is None else environ
    for name in sorted(n for n in seen if n.upper() in RETIRED):
        _log.warning("%s is ignored: %s", name, RETIRED[name.upper()])
    unknown = unknown_variables(seen)
    if unknown:
        raise ConfigurationError(
            [f"{name}: not a setting (misspelt? see docs/operations.md)" for name in unknown]
        )
    repeated = name_map_problems(seen)
    if repeated:
        raise ConfigurationError(repeated)
    problems: list[str]
    try:
        if defaults:
            from pydantic_settings import EnvSettingsSource

            # pydantic-settings ranks arguments above the environment; the app's settings must
            # rank below it, so the environment is merged over them here.
            merged = _deep_merge(dict(defaults), EnvSettingsSource(ProcessorSettings)())
            overrides = _deep_merge(merged, overrides)
        return ProcessorSettings(**overrides)
    except ValidationError as e:
        problems = [_problem(err) for err in e.errors()]
    except SettingsError as e:
        # e.g. a variable that is not valid JSON; the decoder's error keeps the whole text.
        problems = [str(e)]
    # Raised outside the except clauses, so that the refused input is not kept as __context__.
    raise ConfigurationError(problems)


# Settings that name people: a name given twice in one JSON object would silently keep only
# the last one, so the other person's key or role would be dropped without a word.
_BY_NAME = ("SAGA_CONSOLE__OPERATORS", "SAGA_CONSOLE__ROLES", "SAGA_OPERATOR__KEYS")


def name_map_problems(environ: Mapping[str, str]) -> list[str]:
    """A problem per name given twice, or per text that is no JSON, in settings mapping names.

    Each problem says where, never the value.
    """
    import json

    problems: list[str] = []
    for variable in _BY_NAME:
        raw = next((v for n, v in environ.items() if n.upper() == variable), None)
        if raw is None:
            continue

        def pairs(items: list[tuple[str, Any]], variable: str = variable) -> dict[str, Any]:
            names = [k for k, _ in items]
            problems.extend(
                f"{variable}: {name!r} is given more than once"
                for name in sorted({n for n in names if names.count(n) > 1})
            )
            return dict(items)

        try:
            json.loads(raw, object_pairs_hook=pairs)
        except json.JSONDecodeError as e:
            problems.append(f"{variable}: not JSON ({e.msg} at line {e.lineno} column {e.colno})")
    return problems


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on top; nested mappings merge key by key."""
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            out[key] = _deep_merge(dict(below), value)
        else:
            out[key] = value
    return out
