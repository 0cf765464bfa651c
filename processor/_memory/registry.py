"""An in-memory Schema Registry: what the resolver's unit tests and the saga fixture use.

It answers as :class:`processor._kafka.registry.RegistryClient` does (the contract suite runs
the same cases over both): ids from 1, an identical schema keeps its id under a subject, a
schema registered under a subject that has versions must pass its compatibility function.
``down`` makes every call raise ``Retryable``, as an unreachable registry does.
"""

from __future__ import annotations

from collections.abc import Callable

from processor._errors import Retryable, SchemaRefused
from processor._schemas.codec import RegisteredSchema, WriterSchema

__all__ = ["MemoryRegistry"]


class MemoryRegistry:
    """:class:`processor._ports.registry.SchemaRegistry` in a dict.

    Args:
        compatible: Whether a new schema may follow a subject's latest; every one by default.
    """

    url = "memory://registry"

    def __init__(self, compatible: Callable[[str, str], bool] | None = None) -> None:
        self._compatible = compatible or (lambda _old, _new: True)
        self._schemas: dict[int, RegisteredSchema] = {}
        self._subjects: dict[str, list[int]] = {}
        self.down = False
        self.calls = 0

    def _call(self) -> None:
        self.calls += 1
        if self.down:
            raise Retryable("schema registry unreachable (memory): down")

    def fetch(self, schema_id: int) -> RegisteredSchema | None:
        self._call()
        return self._schemas.get(schema_id)

    def _find(self, writer: WriterSchema) -> int | None:
        for schema_id in self._subjects.get(writer.subject, []):
            if self._schemas[schema_id].text == writer.text:
                return schema_id
        return None

    def register(self, writer: WriterSchema) -> int:
        self._call()
        found = self._find(writer)
        if found is not None:
            return found
        versions = self._subjects.setdefault(writer.subject, [])
        if versions and not self._compatible(self._schemas[versions[-1]].text, writer.text):
            raise SchemaRefused(f"the registry refused the schema of subject {writer.subject}")
        schema_id = next(
            (i for i, s in self._schemas.items() if s.text == writer.text),
            len(self._schemas) + 1,
        )
        self._schemas[schema_id] = RegisteredSchema(writer.format.registry_type, writer.text)
        versions.append(schema_id)
        return schema_id

    def lookup(self, writer: WriterSchema) -> int | None:
        self._call()
        return self._find(writer)

    def compatible(self, writer: WriterSchema) -> bool:
        self._call()
        versions = self._subjects.get(writer.subject)
        if not versions:
            return True
        return self._compatible(self._schemas[versions[-1]].text, writer.text)

    def close(self) -> None:
        pass
