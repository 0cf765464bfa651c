"""The message-type registry rejects ambiguous registrations and finds what was registered."""

from datetime import UTC, datetime

import pytest

from processor._authoring.messages import Message, MessageMetadata, MessageRegistry, message_type
from processor._errors import SagaDefinitionError, UnknownMessageType


class Ping(Message):
    n: int


class PingV2(Message):
    n: int
    label: str = ""


class Pong(Message):
    n: int


def test_register_and_look_up_by_name_class_and_latest_version() -> None:
    reg = MessageRegistry()
    v1 = reg.register(Ping, "test.Ping", topic="pings")
    v2 = reg.register(PingV2, "test.Ping", version=2)

    assert reg.by_name("test.Ping") == v2
    assert reg.by_name("test.Ping", 1) == v1
    assert reg.of(Ping).topic == "pings"
    assert reg.of(PingV2).topic is None
    assert Ping in reg
    assert "test.Ping" in reg
    assert Pong not in reg
    assert [(e.name, e.version) for e in reg.all()] == [("test.Ping", 1), ("test.Ping", 2)]


def test_duplicate_name_and_version_is_rejected_naming_the_owner() -> None:
    reg = MessageRegistry()
    reg.register(Ping, "test.Ping")
    with pytest.raises(SagaDefinitionError, match=r"already registered by .*Ping") as info:
        reg.register(Pong, "test.Ping")
    assert "bump the version" in str(info.value)
    assert Pong not in reg


def test_a_class_cannot_be_registered_under_a_second_name() -> None:
    reg = MessageRegistry()
    reg.register(Ping, "test.Ping")
    with pytest.raises(SagaDefinitionError, match=r"already registered as 'test\.Ping'"):
        reg.register(Ping, "test.Other")
    with pytest.raises(SagaDefinitionError, match="already registered"):
        reg.register(Ping, "test.Ping", version=2)


def test_identical_re_registration_is_harmless() -> None:
    reg = MessageRegistry()
    first = reg.register(Ping, "test.Ping", topic="t")
    assert reg.register(Ping, "test.Ping", topic="t") is first
    assert len(reg) == 1


def test_invalid_arguments_are_all_reported() -> None:
    reg = MessageRegistry()
    with pytest.raises(SagaDefinitionError) as info:
        reg.register(dict, "", version=0, topic="")  # type: ignore[arg-type]
    assert len(info.value.problems) == 4


def test_unknown_lookups_raise_unknown_message_type() -> None:
    reg = MessageRegistry()
    reg.register(Ping, "test.Ping")
    with pytest.raises(UnknownMessageType):
        reg.by_name("test.Nope")
    with pytest.raises(UnknownMessageType):
        reg.by_name("test.Ping", 3)
    with pytest.raises(UnknownMessageType, match="@message_type"):
        reg.of(Pong)


def test_decorator_registers_in_the_given_registry_and_returns_the_class() -> None:
    reg = MessageRegistry()

    @message_type("test.Decorated", version=3, topic="cmds", registry=reg)
    class Decorated(Message):
        x: int

    assert reg.by_name("test.Decorated").cls is Decorated
    assert reg.of(Decorated).version == 3
    assert Decorated(x=1).x == 1


def test_messages_are_frozen_and_reject_unknown_fields() -> None:
    ping = Ping(n=1)
    with pytest.raises(ValueError, match="frozen"):
        ping.n = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="Extra inputs"):
        Ping(n=1, extra=2)  # type: ignore[call-arg]


def test_metadata_headers_default_to_empty() -> None:
    meta = MessageMetadata("id", "t", None, None, datetime(2026, 1, 1, tzinfo=UTC), "x", 0, 1, None)
    assert dict(meta.headers) == {}
