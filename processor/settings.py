"""Processor configuration, read once at the entrypoint from `SAGA_*` environment variables.

Nested settings use a double underscore: `SAGA_DEADLINE__POLLING__INTERVAL=5s`. The deadline
settings mirror the names users know from the deadline specification (`enabled`,
`polling.interval`, `polling.batch-size`, `lease-ttl`, `schema.auto`).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from processor.engine.partitioner import Partitioner, normalise
from processor.errors import ConfigurationError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def parse_duration(value: Any) -> Any:
    """Accepts `30s`, `2m`, `250ms`, `1.5h`, ISO 8601 (`PT30S`), seconds, or a timedelta."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            if value.strip().upper().startswith("P"):
                return value  # ISO 8601 (e.g. PT30S): pydantic parses it
            raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 2m, 250ms)")
        return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    return value


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def _identifier(value: str) -> str:
    if not _IDENTIFIER.match(value):
        raise ValueError(f"{value!r} is not a plain lower-case SQL identifier")
    return value


def is_secret_key(key: str) -> bool:
    """True for librdkafka properties that hold credentials.

    Those are ``*.password``, ``sasl.*``, ``ssl.key.*`` and the OAuth client secret.
    """
    k = key.strip().lower()
    return (
        k.endswith(".password")
        or k.startswith("sasl.")
        or k.startswith("ssl.key.")
        or k.endswith(".client.secret")
    )


def _partitioner(value: Any) -> Any:
    return normalise(value) if isinstance(value, str) else value


def _hide_secrets(value: Any) -> Any:
    # Wrapped before validation, so the plain text never sits in the model: repr, str,
    # model_dump and validation errors all show "**********".
    if not isinstance(value, dict):
        return value
    return {
        k: SecretStr(str(v)) if is_secret_key(str(k)) and not isinstance(v, SecretStr) else v
        for k, v in value.items()
    }


class KafkaSettings(BaseModel):
    """The broker to talk to and librdkafka settings for every client (`SAGA_KAFKA__*`).

    Credentials among the librdkafka settings (see :func:`is_secret_key`) are kept as
    ``SecretStr``: they never show in a repr, a log line or an error; only
    :meth:`client_config` hands out their values, to the Kafka clients.
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    # Passed to librdkafka untouched (e.g. security.protocol, sasl.mechanism); never logged.
    config: Annotated[dict[str, str | SecretStr], BeforeValidator(_hide_secrets)] = Field(
        default_factory=dict
    )
    sasl_password: SecretStr | None = None

    def client_config(self) -> dict[str, str]:
        """A fresh dict each call: clients must never share or mutate the caller's config."""
        conf = {"bootstrap.servers": self.bootstrap_servers}
        for key, value in self.config.items():
            conf[key] = value.get_secret_value() if isinstance(value, SecretStr) else value
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        return conf


class DatabaseSettings(BaseModel):
    """The PostgreSQL server and the schema that holds the processor's tables."""

    # Required: a default would carry a password, and would silently point a misconfigured
    # replica at whatever database happens to answer there.
    url: SecretStr
    schema_name: str = "saga"
    # The longest one statement of the processor's loops may run (consumer batches, relay,
    # deadline poller, retention, growth watch, metrics samples); the server cancels it past
    # that and the loop tries again. Operator commands and migrations are not bounded by it.
    statement_timeout: Duration = timedelta(seconds=60)

    _check_schema = field_validator("schema_name")(classmethod(lambda cls, v: _identifier(v)))


class ConsumerSettings(BaseModel):
    """The consumer group, its batches, and how bad records and failing handlers are treated."""

    group_id: str = "saga-processor"
    topics: list[str] = Field(default_factory=list)
    batch_size: int = Field(default=500, ge=1)
    # How long one consume() call may wait to fill a batch; bounds latency at low load.
    batch_timeout: Duration = timedelta(milliseconds=100)
    max_record_bytes: int = Field(default=1_048_576, ge=1)
    handler_attempts: int = Field(default=3, ge=1)
    dead_letter_topic: str = "saga-dead-letters"
    # A batch also ends at about this many bytes of keys and values; the client's fetch and
    # prefetch queue are sized from it, so memory stays bounded however large records are.
    max_batch_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    session_timeout: Duration = timedelta(seconds=45)
    max_poll_interval: Duration = timedelta(minutes=5)
    # How long the database may fail or not answer before this replica gives its partitions
    # back to the group (to replicas that can reach it); it rejoins once the database answers.
    unavailable_timeout: Duration = timedelta(seconds=20)
    # How often sagas parked because something was newer than the code that parked them (an
    # event's schema version, a stored state's version: a rollout, a rolling deploy) are retried
    # by a replica whose code knows it; also once at start.
    resume_interval: Duration = timedelta(seconds=30)
    # The partitioner the producers of the input topics key saga ids with: crc32 (librdkafka's
    # default consistent_random: the Python, Go, .NET and C clients) or murmur2 (the Java
    # clients' default, librdkafka's murmur2_random). Every producer this project makes uses it
    # (relay, participant replies, deadline poller, operator records), deadlines of sagas that
    # moved when a topic grew are fired where it sends them, and records whose key it would
    # send elsewhere are counted and logged. librdkafka's names are accepted too.
    partitioner: Annotated[Partitioner, BeforeValidator(_partitioner)] = "crc32"
    # How often the input topics' partition counts are read (and the consumer's metadata
    # refreshed), so that a growth is noticed within this.
    growth_check_interval: Duration = timedelta(seconds=5)


class RelaySettings(BaseModel):
    """The outbox relay: how much it sends per round and how it waits for work."""

    # Each replica publishes the outbox rows of the input partitions it owns: a replica with
    # its relay off leaves those rows unpublished until its partitions move.
    enabled: bool = True
    batch_size: int = Field(default=1000, ge=1)
    # And at most this many bytes of keys and values per round (a larger row goes alone): the
    # bound on what a round holds in memory. Dead letters keep whole input records, so a relay
    # behind on a thousand 2 MB dead letters would otherwise load 2 GB at once.
    max_batch_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    # The relay is woken in-process after each commit and by NOTIFY from other processes;
    # this is only the fallback.
    poll_interval: Duration = timedelta(seconds=1)
    # How long one round waits for the broker's acknowledgements before giving up (the rows
    # stay in the outbox). A round idle in its transaction for twice this is presumed frozen
    # or cut off, and the server ends it: until then it holds the relay lock of the rows of no
    # partition, and its own partitions' offsets rows (a new owner's claim of them waits).
    flush_timeout: Duration = timedelta(seconds=15)
    # Rounds a row may fail with the same kind of transient error (while other rows go through)
    # before it is set aside in the failed outbox, with its saga's later rows held behind it.
    max_attempts: int = Field(default=10, ge=1)
    # Largest record the relay sends: the producer's message.max.bytes. A larger command is set
    # aside unsent; a larger dead letter is sent with its value cut (the stored row keeps it).
    max_record_bytes: int = Field(default=1_000_000, ge=1024)


class DeadlinePollingSettings(BaseModel):
    """How often the deadline poller sweeps for due deadlines, and how many per sweep."""

    interval: Duration = timedelta(seconds=30)
    batch_size: int = Field(default=100, ge=1)


class DeadlineSchemaSettings(BaseModel):
    """Whether the deadline tables are created on startup."""

    auto: bool = True


class DeadlineSettings(BaseModel):
    """The deadline poller: its lease, its sweeps and its tables (`SAGA_DEADLINE__*`)."""

    enabled: bool = True
    polling: DeadlinePollingSettings = Field(default_factory=DeadlinePollingSettings)
    lease_ttl: Duration = timedelta(minutes=2)
    schema_: DeadlineSchemaSettings = Field(default_factory=DeadlineSchemaSettings, alias="schema")
    table: str = "saga_deadline"
    lock_table: str = "saga_deadline_lock"
    # Deprecated, no effect: a fired record is sent again only when it was consumed without
    # effect (its token outdated) or under a new lease, never on a timer that lag can outrun.
    # Still accepted so that existing configurations load.
    redispatch_after: Duration = timedelta(seconds=30)

    model_config = {"populate_by_name": True}

    _check_tables = field_validator("table", "lock_table")(
        classmethod(lambda cls, v: _identifier(v))
    )

    @model_validator(mode="after")
    def _lease_outlives_interval(self) -> DeadlineSettings:
        if self.lease_ttl <= self.polling.interval:
            raise ValueError(
                f"deadline.lease-ttl ({self.lease_ttl}) must exceed deadline.polling.interval "
                f"({self.polling.interval}): the leader renews its lease once per sweep"
            )
        return self


class HistorySettings(BaseModel):
    """What the saga history keeps of each record (``SAGA_HISTORY__*``)."""

    # full: headers and value as received; hashed: headers and the value's SHA-256 (no
    # personal data kept); off: neither. The commands and deadlines each step produced are
    # kept in every mode.
    payload: Literal["full", "hashed", "off"] = "full"


class OperatorSettings(BaseModel):
    """Operator requests sent into sagas' partitions (``SAGA_OPERATOR__*``)."""

    # Signs operator records (HMAC-SHA256). The processor applies records signed with it as
    # they say who asked: give it to trusted signers only (the console, which records its
    # signed-in user; automation). Unset, with no `keys`: operator records are dead-lettered and
    # the commands that send them refuse to run.
    key: SecretStr | None = None
    # Each person's own key, by name, e.g. {"alice": "..."}: the processor applies a record
    # signed with one and records that name as who asked, whatever the record says. A person
    # sets their key as SAGA_OPERATOR__KEY where they run the CLI.
    keys: dict[str, SecretStr] = Field(default_factory=dict)
    # Who asked, recorded with each request; defaults to the OS user running the command.
    name: str | None = None


ConsoleRole = Literal["viewer", "operator", "admin"]


class ConsoleOperator(BaseModel):
    """One operator who signs in to the console with their own key."""

    key: SecretStr
    role: ConsoleRole = "operator"


class ConsoleSettings(BaseModel):
    """The web console (``SAGA_CONSOLE__*``): see `saga-processor console` and console/auth.py."""

    host: str = "127.0.0.1"
    port: int = Field(default=8088, ge=0, le=65535)
    # A key shared by everyone: signing in with it makes an admin named SAGA_OPERATOR__NAME.
    # Prefer per-operator keys (`operators`) or an authenticating proxy.
    token: SecretStr | None = None
    # Per-operator keys and roles, e.g. {"alice": {"key": "...", "role": "admin"}}: the name
    # signed in is what every action records as "by".
    operators: dict[str, ConsoleOperator] = Field(default_factory=dict)
    # Addresses or networks of an authenticating proxy; its user header is believed only from
    # these (never from a client that could set it itself).
    trusted_proxies: list[str] = Field(default_factory=list)
    user_header: str = "X-Forwarded-User"
    # Roles of proxy users by name; a proxy user not listed gets `proxy_role`.
    roles: dict[str, ConsoleRole] = Field(default_factory=dict)
    proxy_role: ConsoleRole = "viewer"
    # What a request nobody signed may do: read as a viewer, or nothing at all (null).
    anonymous: ConsoleRole | None = "viewer"
    # Whether viewers see saga state, message payloads and dead-letter values (operators and
    # admins always do).
    show_payloads: bool = False


class MetricsSettings(BaseModel):
    """The HTTP endpoint for Prometheus and the probes (`SAGA_METRICS__*`; deploy/METRICS.md)."""

    # 0 disables the endpoint (and the sampler); tests may ask for a free port with `bind_any`.
    port: int = Field(default=9464, ge=0, le=65535)
    host: str = "0.0.0.0"
    # Pick a free port instead of `port` (tests: several processors in one machine).
    bind_any: bool = False
    # How often the database-derived gauges (outbox, deadlines, sagas, lag) are sampled.
    sample_interval: Duration = timedelta(seconds=15)
    # /healthz fails when the consumer loop has not stepped for this long; /readyz fails when
    # the last successful sample of the database is older than this.
    stale_after: Duration = timedelta(seconds=60)


class RetentionSettings(BaseModel):
    """Built-in retention: which old rows the processor deletes, and when (`SAGA_RETENTION__*`).

    Ages count from when a saga ended, a message was applied or recorded, a record was
    dead-lettered or held, or an outbox row was set aside; the database's clock measures them.
    """

    enabled: bool = True
    # An ended saga's row and history are deleted this long after it ended; a tombstone stays.
    ended_sagas: Duration = timedelta(days=30)
    # History rows that applied nothing (duplicates, ignored, parked, stale deadlines).
    history: Duration = timedelta(days=30)
    # How long a message id (applied history rows) and an ended saga (its tombstone) are
    # remembered, so that a redelivered message or a late start event is recognised.
    dedupe_window: Duration = timedelta(days=90)
    # Dead letters are kept until an operator replays or purges them (the stored row is the
    # only full copy of a dead letter whose value was cut to fit the broker); a period deletes
    # them that long after they were recorded, handled or not.
    dead_letters: Duration | None = None
    # Held messages of sagas that are no longer parked (a parked saga's are kept until its retry).
    parked_messages: Duration = timedelta(days=30)
    # Failed and held outbox rows are commands nobody sent: kept until an operator retries or
    # discards them; a period deletes them (and the commands) that long after they were set aside.
    failed_outbox: Duration | None = None
    # Most rows (or ended sagas) one delete removes, each in its own short transaction.
    chunk_size: int = Field(default=1000, ge=1, le=100_000)
    # Time between rounds; a round deletes everything that is due, chunk by chunk.
    interval: Duration = timedelta(minutes=1)
    # Pause between two chunks of a round, so a backlog never monopolises the database.
    chunk_pause: Duration = timedelta(milliseconds=50)

    @model_validator(mode="after")
    def _window_covers_purges(self) -> RetentionSettings:
        if self.dedupe_window < max(self.ended_sagas, self.history):
            raise ValueError(
                f"retention.dedupe-window ({self.dedupe_window}) must be at least "
                f"retention.ended-sagas ({self.ended_sagas}) and retention.history "
                f"({self.history}): it is how long duplicates stay recognised"
            )
        if self.interval <= timedelta(0):
            raise ValueError("retention.interval must be positive")
        return self


class TopicsSettings(BaseModel):
    """What `saga-processor topics create` gives the topics it makes (and `check` expects)."""

    partitions: int = Field(default=12, ge=1)
    # Three copies: a broker can fail, or be restarted for an upgrade, without losing a record.
    replication_factor: int = Field(default=3, ge=1)


class ParticipantSettings(BaseModel):
    """A participant service run by `saga-processor participant run` (`SAGA_PARTICIPANT__*`).

    Its Kafka client, database URL, consumer batch and timeouts, relay, metrics endpoint and
    shutdown budget are the processor's settings of the same names.
    """

    # The schema of its inbox, reply outbox and positions, in the service's own database (kept
    # apart from the processor's tables, and from the service's own if they share a database).
    schema_name: str = "participant"
    # Its consumer group: every replica of one service shares it, two services never do.
    group_id: str = "saga-participants"
    # Shown in pg_stat_activity.
    application_name: str = "saga-participant"

    _check_schema = field_validator("schema_name")(classmethod(lambda cls, v: _identifier(v)))


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
    # Read by the command line only (it configures logging): `text` for a terminal, `json` for
    # a log pipeline. A setting, so that a misspelt value is refused like any other.
    log_format: Literal["text", "json"] = "text"


# `SAGA_*` variables that are not settings but belong to the tools around the processor: the
# test suite, its fault injection, and the local stack scripts. Anything else unknown is a typo.
ALLOWED_PREFIXES = ("SAGA_TEST_", "SAGA_FAULT_")
ALLOWED_NAMES = frozenset(
    {
        "SAGA_LOCAL_DIR",
        "SAGA_CACHE_DIR",
        "SAGA_KAFKA_PORT",
        "SAGA_KAFKA_CONTROLLER_PORT",
        "SAGA_PG_PORT",
        "SAGA_PG_CLUSTER",
        # The application object (`MODULE:ATTR`) the command line loads; read by processor.cli.
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
        logging.getLogger(__name__).warning("%s is ignored: %s", name, RETIRED[name.upper()])
    unknown = unknown_variables(seen)
    if unknown:
        raise ConfigurationError(
            [f"{name}: not a setting (misspelt? see docs/operations.md)" for name in unknown]
        )
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
