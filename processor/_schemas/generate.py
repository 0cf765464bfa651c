"""A message model's schema for a registry: JSON Schema, Avro or Protobuf, generated from it.

All three are derived from the model's serialization JSON Schema (what pydantic writes), so a
value the model serializes is a value of each schema, and a value read through each schema
validates into the model. The record name is the message type's wire name (``shop.OrderPlaced``:
namespace or package ``shop``, name ``OrderPlaced``), so a record from a service that sends no
headers of ours is matched to its type by the name its schema carries.

Protobuf field numbers follow the model's field order, starting at 1: add fields at the end of
a model, never in between, or a field's number changes under the records already written. A
model may fix its own with ``Field(json_schema_extra={"proto_number": N})``.

Pure: no client imports; the Protobuf descriptor is plain ``descriptor_pb2``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from processor._authoring.messages import MessageType

__all__ = [
    "UnsupportedField",
    "avro_schema",
    "json_schema",
    "proto_file",
    "record_name",
]

_NAME_PART = re.compile(r"[^A-Za-z0-9_]")


class UnsupportedField(ValueError):
    """A model field that a schema format cannot express; the message names the field."""


def record_name(mtype: MessageType) -> tuple[str, str]:
    """The (namespace, name) a schema gives ``mtype``: its wire name split at the last dot.

    Each part is made a valid Avro and Protobuf identifier (other characters become ``_``).
    """
    parts = [_ident(p) for p in mtype.name.split(".") if p]
    return ".".join(parts[:-1]), parts[-1]


def _ident(part: str) -> str:
    out = _NAME_PART.sub("_", part)
    return f"_{out}" if out[:1].isdigit() else out


def _model_schema(mtype: MessageType) -> dict[str, Any]:
    return mtype.cls.model_json_schema(mode="serialization")


def json_schema(mtype: MessageType) -> str:
    """The JSON Schema of ``mtype``'s values, titled with its wire name, as registry text."""
    schema = _model_schema(mtype)
    schema["title"] = mtype.name
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


# -- Avro ---------------------------------------------------------------------------------------

_AVRO_SCALARS = {"string": "string", "integer": "long", "number": "double", "boolean": "boolean"}


@dataclass
class _AvroBuilder:
    defs: dict[str, Any]
    namespace: str
    named: set[str]

    def record(self, name: str, schema: dict[str, Any], where: str) -> dict[str, Any]:
        fields = []
        required = set(schema.get("required", ()))
        for field_name, prop in schema.get("properties", {}).items():
            at = f"{where}.{field_name}"
            ftype = self.type_of(prop, at)
            field: dict[str, Any] = {"name": field_name, "type": ftype}
            if field_name not in required:
                default = prop.get("default")
                if default is None and "default" not in prop:
                    # A default_factory leaves no default in the JSON Schema: an empty list or
                    # map is what list and dict factories make.
                    kind = ftype.get("type") if isinstance(ftype, dict) else None
                    default = [] if kind == "array" else {} if kind == "map" else None
                if default is None:
                    if not (isinstance(ftype, list) and ftype[0] == "null"):
                        field["type"] = ["null", ftype]
                    field["default"] = None
                elif isinstance(ftype, list):
                    # A union's default must be of its first branch: the value's own type.
                    field["type"] = [t for t in ftype if t != "null"] + ["null"]
                    field["default"] = default
                else:
                    field["default"] = default
            fields.append(field)
        self.named.add(name)
        out: dict[str, Any] = {"type": "record", "name": name, "fields": fields}
        if self.namespace:
            out["namespace"] = self.namespace
        return out

    def type_of(self, prop: dict[str, Any], where: str) -> Any:
        if "$ref" in prop:
            ref = prop["$ref"].rsplit("/", 1)[-1]
            name = _ident(ref)
            if name in self.named:
                return f"{self.namespace}.{name}" if self.namespace else name
            return self.record(name, self.defs[ref], where)
        if "anyOf" in prop:
            branches = [b for b in prop["anyOf"] if b.get("type") != "null"]
            nullable = len(branches) < len(prop["anyOf"])
            if len(branches) != 1:
                raise UnsupportedField(f"{where}: a union of several types has no Avro schema here")
            inner = self.type_of(branches[0], where)
            return ["null", inner] if nullable else inner
        if "enum" in prop or "const" in prop:
            return "string"
        kind = prop.get("type")
        if kind in _AVRO_SCALARS:
            return _AVRO_SCALARS[kind]
        if kind == "array":
            return {"type": "array", "items": self.type_of(prop.get("items", {}), f"{where}[]")}
        if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
            values = self.type_of(prop["additionalProperties"], f"{where}{{}}")
            return {"type": "map", "values": values}
        raise UnsupportedField(f"{where}: {kind or 'this type'} has no Avro schema here")


def avro_schema(mtype: MessageType) -> dict[str, Any]:
    """The Avro record schema of ``mtype``; named by its wire name (see :func:`record_name`).

    Decimals and datetimes are strings, as in the model's JSON; integers are ``long``.

    Raises:
        UnsupportedField: A field has no Avro form here (a union of several types).
    """
    schema = _model_schema(mtype)
    namespace, name = record_name(mtype)
    builder = _AvroBuilder(schema.get("$defs", {}), namespace, set())
    return builder.record(name, schema, mtype.name)


# -- Protobuf -----------------------------------------------------------------------------------


def proto_file(mtype: MessageType) -> Any:
    """A ``FileDescriptorProto`` (proto3) whose first message is ``mtype``'s.

    Nested models are messages of the same file; an optional field is a proto3 ``optional``
    (its absence is None); a list is ``repeated``; integers are ``int64``.

    Raises:
        UnsupportedField: A field has no Protobuf form here (a map, a list of lists, a union).
    """
    from google.protobuf import descriptor_pb2

    schema = _model_schema(mtype)
    package, name = record_name(mtype)
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"{mtype.name}.v{mtype.version}.proto", package=package, syntax="proto3"
    )
    defs = schema.get("$defs", {})
    done: set[str] = set()

    def message(msg_name: str, body: dict[str, Any], where: str) -> None:
        done.add(msg_name)
        msg = fdp.message_type.add(name=msg_name)
        for place, (field_name, prop) in enumerate(body.get("properties", {}).items(), 1):
            at = f"{where}.{field_name}"
            number = int(prop.get("proto_number", place))
            field = msg.field.add(name=field_name, number=number, json_name=field_name)
            field.label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
            inner = prop
            optional = False
            if "anyOf" in prop:
                branches = [b for b in prop["anyOf"] if b.get("type") != "null"]
                if len(branches) != 1:
                    raise UnsupportedField(f"{at}: a union of several types has no Protobuf form")
                inner, optional = branches[0], len(branches) < len(prop["anyOf"])
            if inner.get("type") == "array":
                field.label = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
                inner = inner.get("items", {})
                if inner.get("type") == "array":
                    raise UnsupportedField(f"{at}: a list of lists has no Protobuf form")
            scalar(field, inner, at)
            if optional and field.label != descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
                field.proto3_optional = True
                field.oneof_index = len(msg.oneof_decl)
                msg.oneof_decl.add(name=f"_{field_name}")

    def scalar(field: Any, prop: dict[str, Any], where: str) -> None:
        types = descriptor_pb2.FieldDescriptorProto
        if "$ref" in prop:
            ref = prop["$ref"].rsplit("/", 1)[-1]
            field.type = types.TYPE_MESSAGE
            field.type_name = f".{package}.{_ident(ref)}" if package else f".{_ident(ref)}"
            if _ident(ref) not in done:
                message(_ident(ref), defs[ref], where)
            return
        kind = "string" if ("enum" in prop or "const" in prop) else prop.get("type")
        mapped = {
            "string": types.TYPE_STRING,
            "integer": types.TYPE_INT64,
            "number": types.TYPE_DOUBLE,
            "boolean": types.TYPE_BOOL,
        }.get(str(kind))
        if mapped is None:
            raise UnsupportedField(f"{where}: {kind or 'this type'} has no Protobuf form here")
        field.type = mapped

    message(name, schema, mtype.name)
    return fdp
