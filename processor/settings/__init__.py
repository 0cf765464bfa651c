"""Processor configuration, read once at the entrypoint from `SAGA_*` environment variables.

Nested settings use a double underscore: `SAGA_DEADLINE__POLLING__INTERVAL=5s`. The deadline
settings mirror the names users know from the deadline specification (`enabled`,
`polling.interval`, `polling.batch-size`, `lease-ttl`, `schema.auto`).

Each group of settings has its module here; :mod:`~processor.settings._loading` holds the whole
(:class:`ProcessorSettings`) and reads it from the environment.
"""

from processor.settings._console import (
    ConsoleOperator,
    ConsoleRole,
    ConsoleSettings,
    OperatorSettings,
)
from processor.settings._consumer import ConsumerSettings
from processor.settings._database import DatabaseSettings
from processor.settings._deadline import (
    DeadlinePollingSettings,
    DeadlineSchemaSettings,
    DeadlineSettings,
)
from processor.settings._kafka import KafkaSettings, TopicsSettings, is_secret_key
from processor.settings._loading import (
    ALLOWED_NAMES,
    ALLOWED_PREFIXES,
    RETIRED,
    ProcessorSettings,
    load_settings,
    unknown_variables,
)
from processor.settings._registry import RegistryTopicSettings, SchemaRegistrySettings
from processor.settings._relay import RelaySettings
from processor.settings._retention import HistorySettings, RetentionSettings
from processor.settings._service import MetricsSettings, ParticipantSettings
from processor.settings._values import Duration, parse_duration

__all__ = [
    "ALLOWED_NAMES",
    "ALLOWED_PREFIXES",
    "RETIRED",
    "ConsoleOperator",
    "ConsoleRole",
    "ConsoleSettings",
    "ConsumerSettings",
    "DatabaseSettings",
    "DeadlinePollingSettings",
    "DeadlineSchemaSettings",
    "DeadlineSettings",
    "Duration",
    "HistorySettings",
    "KafkaSettings",
    "MetricsSettings",
    "OperatorSettings",
    "ParticipantSettings",
    "ProcessorSettings",
    "RegistryTopicSettings",
    "RelaySettings",
    "RetentionSettings",
    "SchemaRegistrySettings",
    "TopicsSettings",
    "is_secret_key",
    "load_settings",
    "parse_duration",
    "unknown_variables",
]
