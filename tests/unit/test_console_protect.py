"""The console's defences on their own: the throttle's back-off, form tokens, parameter checks,
and the identity settings that refuse to start."""

from __future__ import annotations

import pytest

from processor._console.protect import FormTokens, Throttle, parameter_problem, row_id
from processor._console.serve import server_config
from processor._errors import ConfigurationError, SagaError
from processor.settings import load_settings

BASE = {"SAGA_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9092", "SAGA_DATABASE__URL": "postgresql://x/y"}


def test_past_the_free_failures_each_one_doubles_the_wait_and_success_forgets() -> None:
    now = [0.0]
    t = Throttle(free=3, base=2.0, cap=10.0, forget=100.0, clock=lambda: now[0])
    keys = ("address:a", "name:n")
    for _ in range(2):
        assert t.wait(keys) == 0
        t.failed(keys)
    assert t.wait(keys) == 0
    assert t.failed(keys) == 3
    assert t.wait(keys) == 2.0
    assert t.wait(["address:a"]) == 2.0
    assert t.wait(["address:other"]) == 0
    t.failed(keys)
    assert t.wait(keys) == 4.0
    for _ in range(5):
        t.failed(keys)
    assert t.wait(keys) == 10.0  # capped
    now[0] += 50
    assert t.wait(keys) == 0
    t.succeeded(["name:n"])
    assert t.wait(["name:n"]) == 0
    # A key quiet for longer than `forget` starts over.
    now[0] += 200
    assert t.failed(["address:a"]) == 1


def test_the_throttle_forgets_its_oldest_keys_past_its_bound() -> None:
    t = Throttle(most=3)
    for k in "abcd":
        t.failed([k])
    assert set(t._keys) == {"b", "c", "d"}


def test_a_form_token_belongs_to_its_cookie_and_session() -> None:
    forms = FormTokens()
    cookie = forms.new_cookie()
    token = forms.token(cookie, "s1")
    assert forms.valid(cookie, "s1", token)
    assert not forms.valid(cookie, "s2", token)
    assert not forms.valid(forms.new_cookie(), "s1", token)
    assert not forms.valid(None, "s1", token)
    assert not forms.valid(cookie, "s1", None)
    assert not FormTokens().valid(cookie, "s1", token)  # another process's secret


def test_parameters_no_page_takes_are_named() -> None:
    assert parameter_problem("type", "order") is None
    assert parameter_problem("type", "a\x00b") == "bad parameter type: it holds a NUL character"
    long = parameter_problem("attr", "x" * 2001)
    assert long is not None
    assert "longer than 2000" in long
    assert row_id("before", "12") == 12
    assert row_id("before", None) is None
    for bad in ("-1", "abc", "1e3", "\uff19", str(2**63)):
        with pytest.raises(SagaError, match="bad parameter before"):
            row_id("before", bad)


def test_the_console_server_takes_no_client_address_from_headers() -> None:
    config = server_config(object(), "127.0.0.1", 8088)
    assert config.proxy_headers is False
    assert config.server_header is False


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        (
            "SAGA_CONSOLE__OPERATORS",
            '{"alice": {"key": "0123456789abcdefg"}, "alice": {"key": "zzzzzzzzzzzzzzzzzz"}}',
            "SAGA_CONSOLE__OPERATORS: 'alice' is given more than once",
        ),
        (
            "SAGA_CONSOLE__OPERATORS",
            '{"alice": {"key": "0123456789abcdefg", "rol": "admin"}}',
            "SAGA_CONSOLE__OPERATORS__ALICE__ROL: Extra inputs are not permitted",
        ),
        (
            "SAGA_CONSOLE__OPERATORS",
            '{"alice": {"key": "0123456789abcdefg", "role": "root"}}',
            "SAGA_CONSOLE__OPERATORS__ALICE__ROLE",
        ),
        (
            "SAGA_CONSOLE__OPERATORS",
            '{"alice": {"key": "short-key"}}',
            "SAGA_CONSOLE__OPERATORS__ALICE__KEY: Value error, shorter than 16 characters",
        ),
        ("SAGA_CONSOLE__OPERATORS", '{"alice": {"key": "0123', "SAGA_CONSOLE"),
        ("SAGA_CONSOLE__TOKEN", "short-key", "SAGA_CONSOLE__TOKEN: Value error, shorter than 16"),
        ("SAGA_CONSOLE__TRUSTED_PROXIES", '["10.0.0.300"]', "'10.0.0.300' is not an address"),
        ("SAGA_CONSOLE__USER_HEADER", "X-User: root", "not an HTTP header name"),
        ("SAGA_CONSOLE__ROLES", '{"sam": "admin", "sam": "viewer"}', "'sam' is given more than"),
    ],
)
def test_a_malformed_identity_setting_refuses_to_start_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, problem: str
) -> None:
    for name, v in {**BASE, variable: value}.items():
        monkeypatch.setenv(name, v)
    with pytest.raises(ConfigurationError) as e:
        load_settings(sagas=["sagas"])
    assert problem in str(e.value)
    assert "0123456789abcdefg" not in str(e.value)
    assert "short-key" not in str(e.value)


def test_history_retention_must_outlive_the_operator_expiry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, v in BASE.items():
        monkeypatch.setenv(name, v)
    monkeypatch.setenv("SAGA_RETENTION__HISTORY", "20m")
    with pytest.raises(ConfigurationError, match=r"must be more than twice operator\.expiry"):
        load_settings(sagas=["sagas"])
    monkeypatch.setenv("SAGA_OPERATOR__EXPIRY", "5m")
    assert load_settings(sagas=["sagas"]).operator.expiry.total_seconds() == 300
