"""Kafka credentials never show in a repr, a dump or a configuration error."""

from __future__ import annotations

import os

import pytest
from pydantic import SecretStr

from processor._errors import ConfigurationError
from processor.settings import KafkaSettings, is_secret_key, load_settings

SECRETS = {
    "sasl.password": "pw-hunter2",
    "sasl.username": "user-alice",
    "ssl.key.password": "keypw-s3cr3t",
    "ssl.key.pem": "-----BEGIN PRIVATE KEY-----MIIEv",
    "ssl.keystore.password": "store-pw-42",
}
PLAIN = {"security.protocol": "SASL_SSL", "client.id": "saga"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SAGA_") and not name.startswith("SAGA_TEST_"):
            monkeypatch.delenv(name)


def _assert_hidden(text: str) -> None:
    for value in SECRETS.values():
        assert value not in text


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("sasl.password", True),
        ("sasl.oauthbearer.config", True),
        ("ssl.key.pem", True),
        ("ssl.keystore.password", True),
        ("SSL.Key.Location", True),
        ("security.protocol", False),
        ("ssl.ca.location", False),
        ("bootstrap.servers", False),
    ],
)
def test_secret_keys(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_repr_str_and_dump_hide_credentials_but_the_client_gets_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json

    monkeypatch.setenv("SAGA_KAFKA__CONFIG", json.dumps({**SECRETS, **PLAIN}))
    monkeypatch.setenv("SAGA_KAFKA__SASL_PASSWORD", "pw-hunter2")
    monkeypatch.setenv("SAGA_DATABASE__URL", "postgresql://saga@127.0.0.1/saga")
    settings = load_settings()
    for text in (
        repr(settings),
        str(settings),
        repr(settings.kafka),
        repr(settings.kafka.config),
        settings.model_dump_json(),
        str(settings.model_dump()),
    ):
        _assert_hidden(text)
    assert "SASL_SSL" in repr(settings.kafka)  # only credentials are masked
    conf = settings.kafka.client_config()
    assert conf == {"bootstrap.servers": "127.0.0.1:9092", **SECRETS, **PLAIN}
    assert all(isinstance(v, str) for v in conf.values())


def test_settings_built_in_code_hide_credentials_too() -> None:
    kafka = KafkaSettings(config={"sasl.password": "pw-hunter2", "client.id": "x"})
    assert isinstance(kafka.config["sasl.password"], SecretStr)
    assert kafka.config["client.id"] == "x"
    _assert_hidden(repr(kafka))
    assert kafka.client_config()["sasl.password"] == "pw-hunter2"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        # Not JSON: the decoder's error would quote the text.
        ("SAGA_KAFKA__CONFIG", '{"sasl.password": "pw-hunter2",'),
        # A wrong type next to a secret: pydantic's error would echo the input.
        ("SAGA_KAFKA", '{"config": {"sasl.password": "pw-hunter2"}, "bootstrap_servers": 5}'),
        ("SAGA_KAFKA", '["sasl.password=pw-hunter2"]'),
        ("SAGA_KAFKA__CONFIG", '{"sasl.username": "user-alice", "client.id": ["x"]}'),
    ],
)
def test_configuration_errors_carry_no_secret(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    error = caught.value
    _assert_hidden(str(error))
    _assert_hidden(repr(error))
    # Nothing reachable from the error keeps the refused input either.
    assert error.__cause__ is None
    assert error.__context__ is None
