"""`schemas register|check`: what the registry says of each of the models' schemas."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from processor._errors import SchemaRefused
from processor._ports.registry import SchemaRegistry
from processor._schemas.codec import WriterSchema
from processor._schemas.plan import SchemaPlan, SchemaVerdict

__all__ = ["check_schemas", "register_schemas"]

_Judge = Callable[[SchemaPlan, WriterSchema], SchemaVerdict]


def register_schemas(client: SchemaRegistry, plans: list[SchemaPlan]) -> list[SchemaVerdict]:
    """Registers each plan's schema (an identical one keeps its id).

    Raises:
        Retryable: The registry could not be reached.
    """
    return [_verdict(plan, partial(_register, client)) for plan in plans]


def check_schemas(client: SchemaRegistry, plans: list[SchemaPlan]) -> list[SchemaVerdict]:
    """Whether each plan's schema would be accepted under its subject; registers nothing.

    Raises:
        Retryable: The registry could not be reached.
    """
    return [_verdict(plan, partial(_check, client)) for plan in plans]


def _verdict(plan: SchemaPlan, judge: _Judge) -> SchemaVerdict:
    if plan.writer is None:
        return SchemaVerdict(plan, "invalid", detail=plan.problem or "")
    return judge(plan, plan.writer)


def _register(client: SchemaRegistry, plan: SchemaPlan, writer: WriterSchema) -> SchemaVerdict:
    try:
        return SchemaVerdict(plan, "registered", client.register(writer))
    except SchemaRefused as e:
        return SchemaVerdict(plan, "incompatible", detail=str(e))


def _check(client: SchemaRegistry, plan: SchemaPlan, writer: WriterSchema) -> SchemaVerdict:
    try:
        found = client.lookup(writer)
        if found is not None:
            return SchemaVerdict(plan, "registered", found)
        fits = client.compatible(writer)
    except SchemaRefused as e:
        return SchemaVerdict(plan, "invalid", detail=str(e))
    if fits:
        return SchemaVerdict(plan, "compatible")
    return SchemaVerdict(plan, "incompatible", detail="the subject's compatibility rule refuses it")
