"""`schemas register|check`: what the registry says of each of the models' schemas."""

from __future__ import annotations

from processor._errors import SchemaRefused
from processor._ports.registry import SchemaRegistry
from processor._schemas.plan import SchemaPlan, SchemaVerdict

__all__ = ["check_schemas", "register_schemas"]


def register_schemas(client: SchemaRegistry, plans: list[SchemaPlan]) -> list[SchemaVerdict]:
    """Registers each plan's schema (an identical one keeps its id).

    Raises:
        Retryable: The registry could not be reached.
    """
    out = []
    for plan in plans:
        if plan.writer is None:
            out.append(SchemaVerdict(plan, "invalid", detail=plan.problem or ""))
            continue
        try:
            out.append(SchemaVerdict(plan, "registered", client.register(plan.writer)))
        except SchemaRefused as e:
            out.append(SchemaVerdict(plan, "incompatible", detail=str(e)))
    return out


def check_schemas(client: SchemaRegistry, plans: list[SchemaPlan]) -> list[SchemaVerdict]:
    """Whether each plan's schema would be accepted under its subject; registers nothing.

    Raises:
        Retryable: The registry could not be reached.
    """
    out = []
    for plan in plans:
        if plan.writer is None:
            out.append(SchemaVerdict(plan, "invalid", detail=plan.problem or ""))
            continue
        try:
            found = client.lookup(plan.writer)
            if found is not None:
                out.append(SchemaVerdict(plan, "registered", found))
                continue
            fits = client.compatible(plan.writer)
        except SchemaRefused as e:
            out.append(SchemaVerdict(plan, "invalid", detail=str(e)))
            continue
        outcome = "compatible" if fits else "incompatible"
        detail = "" if fits else "the subject's compatibility rule refuses it"
        out.append(SchemaVerdict(plan, outcome, detail=detail))
    return out
