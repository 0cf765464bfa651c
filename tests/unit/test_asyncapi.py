"""The generated AsyncAPI document is valid AsyncAPI 3.0.0, and its payload schemas agree with
the models: what a validator of the document accepts, the processor accepts, and the reverse."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

import schemas  # noqa: F401 - registers the example messages
from processor._authoring.asyncapi import asyncapi_document, render
from processor._authoring.definition import definition_of
from processor._authoring.messages import registry
from processor._cli import main as cli_main
from sagas import ALL_SAGAS, TRIP_SAGAS
from schemas.transfers import DebitAccount

SPEC = Path(__file__).resolve().parents[1] / "data" / "asyncapi" / "3.0.0.json.gz"
HEADERS = (
    "message-id",
    "message-type",
    "schema-version",
    "correlation-id",
    "causation-id",
    "occurred-at",
    "saga-type",
    "saga-id",
    "deadline-unix-ms",
    "traceparent",
)


def _document() -> dict[str, Any]:
    # Every saga the `sagas` package exposes, as `saga-processor schemas schemas sagas` finds.
    return asyncapi_document(registry, [definition_of(s) for s in (*ALL_SAGAS, *TRIP_SAGAS)])


def _spec_validator() -> jsonschema.Draft7Validator:
    spec = json.loads(gzip.decompress(SPEC.read_bytes()))
    return jsonschema.Draft7Validator(spec)


def test_document_is_valid_asyncapi_3() -> None:
    validator = _spec_validator()
    document = _document()
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]


def test_the_validator_refuses_a_broken_document() -> None:
    # Proves the check above can fail: an operation with an unknown action is not AsyncAPI.
    broken = copy.deepcopy(_document())
    next(iter(broken["operations"].values()))["action"] = "publish"
    assert not _spec_validator().is_valid(broken)


def test_document_names_every_topic_header_and_key_rule() -> None:
    document = _document()
    addresses = {c["address"] for c in document["channels"].values()}
    topics = {e.topic for e in registry.all() if e.topic}
    assert topics | {"saga-dead-letters"} <= addresses
    for entry in registry.all():
        message = document["components"]["messages"][f"{entry.name}.v{entry.version}"]
        assert set(HEADERS) <= set(message["headers"]["properties"])
        assert message["headers"]["properties"]["message-type"]["const"] == entry.name
        assert message["bindings"]["kafka"]["key"]["description"].startswith("Record key")
    placed = document["components"]["messages"]["orders.OrderPlaced.v1"]
    assert placed["x-key"] == "order_id"
    # Handlers a saga generates (the trip's declared replies) key their events the same way.
    assert document["components"]["messages"]["trips.HotelReserved.v1"]["x-key"] == "trip_id"
    assert document["operations"]["receive-order-events"]["action"] == "receive"
    assert document["operations"]["send-order-commands"]["action"] == "send"


def _payload_validator(document: dict[str, Any], name: str) -> jsonschema.Draft7Validator:
    # Resolves the payload's document-local $refs against the document itself.
    resource = Resource.from_contents(document, default_specification=DRAFT7)
    reg: Registry[Any] = Registry().with_resource("urn:doc", resource)
    return jsonschema.Draft7Validator(
        {"$ref": f"urn:doc#/components/schemas/{name}"},
        registry=reg,
        format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER,
    )


AMOUNTS = [
    "12.50",
    "7",
    "0.05",
    "0.10",
    "1234567890123456.99",
    "0",
    "0.00",
    "-1",
    " 1",
    "1_0",
    "+1",
    ".5",
    "5.",
    "1.500",
    "1e2",
    "NaN",
    "12345678901234567",
    12.5,
    7,
]


@pytest.mark.parametrize("amount", AMOUNTS, ids=[repr(a) for a in AMOUNTS])
def test_amount_schema_agrees_with_the_model(amount: object) -> None:
    document = _document()
    validator = _payload_validator(document, "transfers.DebitAccount.v1")
    body = {"transfer_id": "t-1", "account_id": "a", "amount": amount}
    by_schema = validator.is_valid(body)
    try:
        DebitAccount.model_validate_json(json.dumps(body))
        by_model = True
    except ValidationError:
        by_model = False
    assert by_schema == by_model


def test_every_payload_schema_accepts_what_the_model_writes() -> None:
    document = _document()
    placed = {
        "order_id": "o-1",
        "customer_id": "c-1",
        "sku": "s",
        "quantity": 1,
        "amount": "25.00",
    }
    validator = _payload_validator(document, "orders.OrderPlaced.v1")
    assert validator.is_valid(placed)
    assert not validator.is_valid({**placed, "unknown": 1})  # the model forbids extras too


def test_schemas_command_prints_the_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["schemas", "schemas", "sagas"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed) == json.loads(render(_document()))


PROBES: list[object] = ["x", "", "1", "12.50", 1, 1.0, 1.5, 0, -1, True, None, [], {}]


def _valid_value(schema: dict[str, Any]) -> Any:
    if "const" in schema:
        return schema["const"]
    if "examples" in schema:
        return schema["examples"][0]
    if "anyOf" in schema:
        return _valid_value(schema["anyOf"][0])
    return {"string": "s", "integer": 1}[schema["type"]]


# The example messages only: other test modules register their own (with plain Decimal fields),
# and which of them are imported by collection time depends on what else the run collects.
EXAMPLES = [e for e in registry.all() if e.cls.__module__.startswith("schemas.")]


@pytest.mark.parametrize("entry", EXAMPLES, ids=lambda e: f"{e.name}.v{e.version}")
def test_every_payload_schema_accepts_exactly_what_its_model_accepts(entry: Any) -> None:
    # A valid payload built from the schema, then each field replaced by each probe in turn:
    # the document's validator and the processor's decoder must agree on every one.
    document = _document()
    name = f"{entry.name}.v{entry.version}"
    schema = document["components"]["schemas"][name]
    validator = _payload_validator(document, name)
    valid = {k: _valid_value(p) for k, p in schema["properties"].items()}
    assert validator.is_valid(valid)
    entry.cls.model_validate_json(json.dumps(valid))
    disagreements = []
    for field in schema["properties"]:
        for probe in PROBES:
            body = {**valid, field: probe}
            try:
                entry.cls.model_validate_json(json.dumps(body))
                by_model = True
            except ValidationError:
                by_model = False
            if validator.is_valid(body) != by_model:
                disagreements.append((field, probe, by_model))
    assert disagreements == []


def test_a_saga_function_s_start_and_awaited_events_are_what_it_receives() -> None:
    from sagas.trip_function import trip_function

    document = asyncapi_document(registry, [definition_of(trip_function)])
    messages = document["components"]["messages"]
    for name in ("trips.TripRequested", "trips.FlightReserved", "trips.TripDecided"):
        [entry] = [m for m in messages.values() if m.get("name") == name]
        # Keyed by the saga's association property, as every event a saga consumes.
        assert entry["x-key"] == "trip_id", name
    receive = document["operations"]["receive-trip-events"]
    assert receive["action"] == "receive"
    assert "send-trip-commands" in document["operations"]
