"""The Schema Registry port: the in-memory registry and the real client give the same answers.

The real side talks to the run's registry (Apicurio, deploy/local/registry.sh) through
confluent-kafka's client; an unreachable one is a closed port on loopback.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator

import pytest

from processor._errors import Retryable
from processor._kafka.registry import RegistryClient
from processor._memory.registry import MemoryRegistry
from processor._ports.registry import SchemaRegistry
from processor._schemas.codec import WriterSchema
from processor._schemas.formats import WireFormat


@pytest.fixture(params=["memory", "registry"])
def registry(request: pytest.FixtureRequest) -> Iterator[SchemaRegistry]:
    if request.param == "memory":
        yield MemoryRegistry()
        return
    client = RegistryClient({"url": request.getfixturevalue("schema_registry_url")})
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(params=["memory", "registry"])
def unreachable(request: pytest.FixtureRequest) -> Iterator[SchemaRegistry]:
    if request.param == "memory":
        made = MemoryRegistry()
        made.down = True
        yield made
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Nothing listens on the port once the socket is closed: every call is refused.
    client = RegistryClient({"url": f"http://127.0.0.1:{port}"})
    try:
        yield client
    finally:
        client.close()


def _avro(name: str, *fields: str) -> WriterSchema:
    schema = {
        "type": "record",
        "name": name,
        "fields": [{"name": f, "type": "string"} for f in fields],
    }
    return WriterSchema(
        f"contract-{uuid.uuid4().hex[:8]}-value", WireFormat.AVRO, json.dumps(schema)
    )


def test_a_registered_schema_keeps_its_id_and_is_fetched_by_it(registry: SchemaRegistry) -> None:
    writer = _avro("Paid", "order_id")
    assert registry.lookup(writer) is None
    assert registry.compatible(writer) is True  # a new subject takes anything
    schema_id = registry.register(writer)
    assert registry.register(writer) == schema_id
    assert registry.lookup(writer) == schema_id
    assert registry.compatible(writer) is True
    fetched = registry.fetch(schema_id)
    assert fetched is not None
    assert fetched.kind == "AVRO"
    assert json.loads(fetched.text) == json.loads(writer.text)


def test_an_id_the_registry_never_gave_is_unknown(registry: SchemaRegistry) -> None:
    assert registry.fetch(2_000_000_000) is None


def test_a_second_version_under_a_subject_gets_an_id_of_its_own(registry: SchemaRegistry) -> None:
    first = _avro("Paid", "order_id")
    second = WriterSchema(first.subject, first.format, _avro("Paid", "order_id", "note").text)
    assert registry.register(first) != registry.register(second)
    assert registry.lookup(first) is not None


def test_an_unreachable_registry_is_retryable_never_unknown(unreachable: SchemaRegistry) -> None:
    writer = _avro("Paid", "order_id")
    for call in (
        lambda: unreachable.fetch(1),
        lambda: unreachable.register(writer),
        lambda: unreachable.lookup(writer),
        lambda: unreachable.compatible(writer),
    ):
        with pytest.raises(Retryable, match="unreachable"):
            call()
