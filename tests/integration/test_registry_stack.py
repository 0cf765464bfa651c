"""The Schema Registry under the tests is real: what a client registers, it reads back by id."""

from __future__ import annotations

import json
import os
import socket
import uuid
from urllib.parse import urlsplit

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from devstack import Registry

pytestmark = pytest.mark.integration


def test_a_registered_json_schema_reads_back_by_its_id(schema_registry: Registry) -> None:
    subject = f"registry-stack-{uuid.uuid4().hex[:8]}-value"
    document = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Probe",
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
        "required": ["order_id"],
    }
    with SchemaRegistryClient({"url": schema_registry.url}) as client:
        schema_id = client.register_schema(subject, Schema(json.dumps(document), "JSON"))

    # A client of its own: nothing from the first one's cache.
    with SchemaRegistryClient({"url": schema_registry.url}) as fresh:
        found = fresh.get_schema(schema_id)
        latest = fresh.get_latest_version(subject)
        subjects = fresh.get_subjects()
    assert found.schema_type == "JSON"
    assert found.schema_str is not None
    assert json.loads(found.schema_str) == document
    assert latest.schema_id == schema_id
    assert subject in subjects


@pytest.mark.serial
def test_a_stopped_and_started_registry_keeps_its_schemas(schema_registry: Registry) -> None:
    if schema_registry.stop is None or schema_registry.start is None:
        pytest.skip("the registry was not started by this run, so it is not stopped here")
    if os.environ.get("SAGA_REGISTRY_STORAGE") == "memory":
        pytest.skip("SAGA_REGISTRY_STORAGE=memory: a restart forgets every schema")
    subject = f"registry-restart-{uuid.uuid4().hex[:8]}-value"
    document = {"type": "object", "properties": {"n": {"type": "integer"}}}
    with SchemaRegistryClient({"url": schema_registry.url}) as client:
        schema_id = client.register_schema(subject, Schema(json.dumps(document), "JSON"))

    schema_registry.stop()
    # Really stopped: nothing listens on its port any more.
    address = urlsplit(schema_registry.url)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((address.hostname, address.port), timeout=5).close()
    schema_registry.start()

    with SchemaRegistryClient({"url": schema_registry.url}) as fresh:
        found = fresh.get_schema(schema_id)
        assert fresh.get_latest_version(subject).schema_id == schema_id
    assert found.schema_str is not None
    assert json.loads(found.schema_str) == document
