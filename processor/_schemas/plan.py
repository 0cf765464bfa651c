"""Which schemas a deploy writes to the registry, and what the registry says of each.

A message type is written on a framed topic when that topic is its registered topic: the
commands a saga sends, the replies and events it reads. Every version of a type is registered
in order, so the subject's history is the code's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from processor._authoring.messages import MessageRegistry, MessageType
from processor._schemas.codec import WriterSchema, writer_schema
from processor._schemas.formats import SubjectNaming, TopicFormat
from processor._schemas.generate import UnsupportedField

__all__ = ["SchemaPlan", "SchemaVerdict", "plan_schemas"]


@dataclass(frozen=True, slots=True)
class SchemaPlan:
    """One message type's schema on one framed topic (or why it has none)."""

    topic: str
    mtype: MessageType
    writer: WriterSchema | None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class SchemaVerdict:
    """What the registry said of one plan.

    Attributes:
        plan: The schema.
        outcome: ``registered`` (with ``schema_id``), ``compatible`` (a new subject is),
            ``incompatible`` or ``invalid``.
        schema_id: Its id, once registered.
        detail: The registry's reason for a refusal.
    """

    plan: SchemaPlan
    outcome: str
    schema_id: int | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in ("registered", "compatible")


def plan_schemas(
    registry: MessageRegistry,
    topics: Mapping[str, TopicFormat],
    naming: SubjectNaming,
    prefix: str = "",
) -> list[SchemaPlan]:
    """Every (framed topic, message type version) pair, oldest version first."""
    out: list[SchemaPlan] = []
    for mtype in sorted(registry.all(), key=lambda m: (m.topic or "", m.name, m.version)):
        if mtype.topic is None:
            continue
        topic = f"{prefix}{mtype.topic}"
        fmt = topics.get(topic)
        if fmt is None:
            continue
        try:
            out.append(SchemaPlan(topic, mtype, writer_schema(mtype, topic, fmt.format, naming)))
        except UnsupportedField as e:
            out.append(SchemaPlan(topic, mtype, None, f"{e}; declare the field differently"))
    return out
