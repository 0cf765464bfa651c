"""A batch's rows as the parameters of its statements (see :mod:`processor._postgres.batch.store`).

The hot statements take a batch's rows as one JSON array of arrays, encoded by one typed
pydantic-core call; bytes are not JSON and go beside, as binary arrays. The field getters name
each row's fields in the order the statements of :mod:`processor._postgres.batch.sql` read them
(``x->>0``, ...).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any

from pydantic import TypeAdapter
from pydantic_core import to_json

from processor._engine.records import Record
from processor._engine.rows import HeldMessage, PastInput, SagaKey

# Rows as the JSON arrays the inserts and updates read (`x->>0`, ...): the fields in that
# order, JSON values (a saga's state, headers, effects) nested as they are. One pydantic-core call
# encodes a batch's rows; an array parameter per column cost a Python step per value to build
# and another to dump. Bytes are not JSON: they go beside, as binary arrays.
history_fields = attrgetter(
    "saga_type",
    "saga_id",
    "message_id",
    "message_type",
    "kind",
    "outcome",
    "version",
    "topic",
    "partition",
    "offset",
    "detail",
    "headers",
    "effects",
)
# A saga row's fields; an updated row carries the version it expects before its machine state.
_SAGA_FIELDS = ("saga_type", "saga_id", "state", "status", "version", "parked_reason")
new_saga_fields = attrgetter(*_SAGA_FIELDS, "machine_state", "state_version")
old_saga_fields = attrgetter(*_SAGA_FIELDS, "expected_version", "machine_state", "state_version")
outbox_fields = attrgetter("saga_type", "saga_id", "topic", "partition", "headers", "source")
deadline_fields = attrgetter(
    "id",
    "saga_type",
    "saga_id",
    "name",
    "due_at",
    "payload",
    "topic",
    "partition",
    "traceparent",
    "tracestate",
)


def json_text(value: Any) -> str | None:
    # pydantic-core's encoder: several times faster than json.dumps on the per-row hot path.
    return None if value is None else to_json(value).decode()


class _Rows:
    """Encodes rows of known field types as one JSON array of arrays.

    The same bytes as ``to_json`` of the tuples, several times faster: a serializer that knows
    each field's type skips inferring it value by value (and a ``StrEnum`` field, declared str,
    skips the enum's slow ``value`` property). JSON values (state, headers, effects, payloads)
    are ``Any``: encoded as ``to_json`` would. A value of another type than declared is still
    encoded, by inference, with a warning.
    """

    def __init__(self, *fields: Any) -> None:
        self._adapter: TypeAdapter[Any] = TypeAdapter(list[tuple[fields]])  # type: ignore[valid-type]

    def __call__(self, rows: Iterable[Sequence[Any]]) -> str:
        rows = rows if isinstance(rows, list) else list(rows)
        return self._adapter.dump_json(rows, fallback=_plain_mapping).decode()


_Text = str | None
encode_keys = _Rows(str, str)
encode_message_keys = _Rows(str, str, str)
encode_history = _Rows(str, str, str, str, str, str, int | None, str, int, int, _Text, Any, Any)
encode_new_sagas = _Rows(str, str, Any, str, int, _Text, _Text, int)
encode_old_sagas = _Rows(str, str, Any, str, int, _Text, int, _Text, int)
encode_deadlines = _Rows(str, str, str, str, datetime, Any, str, int, _Text, _Text)
encode_outbox = _Rows(_Text, _Text, str, int | None, Any, tuple[str, int] | None)
# The same rows with their bucket last, for tables distributed by bucket (sql_buckets).
encode_history_b = _Rows(
    str, str, str, str, str, str, int | None, str, int, int, _Text, Any, Any, int
)
encode_new_sagas_b = _Rows(str, str, Any, str, int, _Text, _Text, int, int)
encode_deadlines_b = _Rows(str, str, str, str, datetime, Any, str, int, _Text, _Text, int)
encode_outbox_b = _Rows(_Text, _Text, str, int | None, Any, tuple[str, int] | None, int)


def _plain_mapping(value: Any) -> Any:
    # An outbox row's headers may be any Mapping; the encoder takes only dicts by itself.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def past_inputs(rows: Sequence[Sequence[Any]]) -> dict[SagaKey, list[PastInput]]:
    """``LOAD_HISTORY`` rows by saga, oldest first."""
    found: dict[SagaKey, list[PastInput]] = {}
    for t, i, mid, mtype, kind, outcome, version, topic, part, offset, h, p, e in rows:
        headers = h if isinstance(h, Mapping) or h is None else json.loads(h)
        past = PastInput(
            mid, mtype, kind, outcome, version, topic, part, offset, headers,
            bytes(p) if p is not None else None, e,
        )  # fmt: skip
        found.setdefault((t, i), []).append(past)
    return found


def held_message(row: Sequence[Any]) -> HeldMessage:
    """A ``parked_message`` row (id, topic, partition, offset, key, value, headers) as held."""
    parked_id, topic, partition, offset, key, value, headers = row
    pairs = headers.items() if isinstance(headers, Mapping) else json.loads(headers).items()
    return HeldMessage(
        int(parked_id),
        Record(
            topic=topic,
            partition=int(partition),
            offset=int(offset),
            key=bytes(key) if key is not None else None,
            value=bytes(value),
            headers=tuple((str(k), str(v).encode()) for k, v in pairs),
        ),
    )
