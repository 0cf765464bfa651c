"""The composition root: the one place that chooses and builds the adapters.

Every process (a processor, a participant service, the CLI, the console, the publishers) gets
its PostgreSQL and Kafka adapters from here, configured from the processor's settings:

- :mod:`~processor._bootstrap.adapters`: :class:`Adapters`, the processor's and the operator
  tools' (it implements :class:`processor._ports.AdapterFactory`);
- :mod:`~processor._bootstrap.processor`: :func:`build_processor`, a processor from settings;
- :mod:`~processor._bootstrap.participant`: :class:`ParticipantService` and its process;
- :mod:`~processor._bootstrap.service`: the adapters of a service owning one schema;
- :mod:`~processor._bootstrap.clients`: the Kafka producers and consumers, from a client config;
- :mod:`~processor._bootstrap.outbox`: the outbox table the outbox event publisher writes;
- :mod:`~processor._bootstrap.errors`: whether a failure means a service is out of reach.

Names are loaded on first use, so a publisher that needs only the Kafka producers does not
import the database driver.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from processor._bootstrap.adapters import Adapters, instance_id_for, tables_for
    from processor._bootstrap.participant import ParticipantService
    from processor._bootstrap.processor import build_processor

__all__ = ["Adapters", "ParticipantService", "build_processor", "instance_id_for", "tables_for"]

_HOMES = {
    "Adapters": "adapters",
    "instance_id_for": "adapters",
    "tables_for": "adapters",
    "ParticipantService": "participant",
    "build_processor": "processor",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'processor._bootstrap' has no attribute {name!r}")
    return getattr(importlib.import_module(f"processor._bootstrap.{home}"), name)
