"""The Schema Registry as the runtime and the operator tools see it."""

from __future__ import annotations

from typing import Protocol

from processor._schemas.codec import RegisteredSchema, WriterSchema

__all__ = ["SchemaRegistry"]


class SchemaRegistry(Protocol):
    """A registry's answers: the thing, None when it holds no such thing, or ``Retryable``.

    A registry that cannot be reached raises ``Retryable``; a schema it refuses (incompatible
    or invalid) raises :class:`processor._errors.SchemaRefused`.
    """

    @property
    def url(self) -> str: ...

    def fetch(self, schema_id: int) -> RegisteredSchema | None:
        """The schema of ``schema_id``; None when the registry holds none."""
        ...

    def register(self, writer: WriterSchema) -> int:
        """The id of ``writer`` under its subject, registered if it is new there."""
        ...

    def lookup(self, writer: WriterSchema) -> int | None:
        """The id of ``writer`` under its subject; None when it is not registered there."""
        ...

    def compatible(self, writer: WriterSchema) -> bool:
        """Whether the subject's rules accept ``writer`` (a subject with no versions does)."""
        ...

    def close(self) -> None: ...
