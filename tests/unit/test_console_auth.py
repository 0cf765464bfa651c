"""The console's identities and roles: a trusted proxy, server-side sessions, keys, anonymity."""

from __future__ import annotations

import pytest

from processor._console.auth import MAX_SESSIONS, Authenticator, Identity, allowed
from processor._errors import ConfigurationError

OLGA, ADA = "olga-key-0123456789", "ada-key-0123456789"
KEYS = {"olga": (OLGA, "operator"), "ada": (ADA, "admin")}


def _auth(**kw: object) -> Authenticator:
    return Authenticator(keys=KEYS, **kw)  # type: ignore[arg-type]


def test_a_proxys_user_header_counts_only_from_the_proxy() -> None:
    auth = _auth(trusted_proxies=["10.0.0.0/8"], proxy_roles={"root": "admin"})
    headers = [("x-forwarded-user", "sam")]
    assert auth.identify(headers, "10.1.2.3", None) == Identity("sam", "viewer")
    assert auth.identify([("x-forwarded-user", "root")], "10.1.2.3", None).role == "admin"
    # Anyone else could set the header themselves: ignored.
    assert auth.identify(headers, "192.168.1.5", None) == Identity(None, "viewer")
    assert auth.identify(headers, None, None) == Identity(None, "viewer")


def test_a_peer_rewritten_from_x_forwarded_for_is_not_the_proxy() -> None:
    """A server that took the client address from X-Forwarded-For hands the app a peer that
    stands in the header itself: that is what the client said, so it is not believed."""
    auth = _auth(trusted_proxies=["127.0.0.2"], proxy_roles={"root": "admin"})
    spoof = [("x-forwarded-for", "127.0.0.2"), ("x-forwarded-user", "root")]
    assert auth.identify(spoof, "127.0.0.2", None) == Identity(None, "viewer")
    assert auth.client_address(spoof, "127.0.0.2") == "127.0.0.2"
    # The real proxy appends the client it saw; that is who gets throttled and logged.
    real = [("x-forwarded-for", "203.0.113.9"), ("x-forwarded-user", "root")]
    assert auth.identify(real, "127.0.0.2", None) == Identity("root", "admin")
    assert auth.client_address(real, "127.0.0.2") == "203.0.113.9"
    assert auth.client_address(real, "127.0.0.1") == "127.0.0.1"


def test_only_the_configured_header_given_once_names_a_proxy_user() -> None:
    auth = _auth(trusted_proxies=["10.0.0.1"], user_header="X-Remote-User")
    assert auth.identify([("x-forwarded-user", "sam")], "10.0.0.1", None).name is None
    assert auth.identify([("x-remote-user", "sam")], "10.0.0.1", None).name == "sam"
    twice = [("x-remote-user", "sam"), ("x-remote-user", "root")]
    assert auth.identify(twice, "10.0.0.1", None).name is None


def test_tls_is_the_schemes_or_a_trusted_proxys_word() -> None:
    auth = _auth(trusted_proxies=["10.0.0.1"])
    https = [("x-forwarded-proto", "https")]
    assert auth.over_tls("https", [], "192.0.2.1")
    assert auth.over_tls("http", https, "10.0.0.1")
    assert not auth.over_tls("http", https, "192.0.2.1")
    assert not auth.over_tls("http", [], "10.0.0.1")


def test_a_session_lives_on_the_server_and_ends_on_sign_out_or_key_removal() -> None:
    now = [1000.0]
    auth = _auth(clock=lambda: now[0])
    olga = auth.sign_in("olga", OLGA)
    assert olga == Identity("olga", "operator")
    assert auth.sign_in("olga", ADA) is None
    assert auth.sign_in("nobody", "") is None
    assert olga is not None
    cookie = auth.start_session(olga)
    assert auth.identify([], "127.0.0.1", cookie) == olga
    # Another console process does not know it.
    assert _auth().identify([], "127.0.0.1", cookie) == Identity(None, "viewer")
    auth.end_session(cookie)
    assert auth.identify([], "127.0.0.1", cookie) == Identity(None, "viewer")
    # Removing the key ends every session it signed in.
    ada = auth.sign_in("ada", ADA)
    assert ada is not None
    first, second = auth.start_session(ada), auth.start_session(ada)
    auth.remove_key("ada")
    assert auth.identify([], "127.0.0.1", first).name is None
    assert auth.identify([], "127.0.0.1", second).name is None
    # A changed key too; a session expires after 12 hours.
    cookie = auth.start_session(olga)
    auth.add_key("olga", "a-new-key-for-olga-0", "operator")
    assert auth.identify([], "127.0.0.1", cookie).name is None
    cookie = auth.start_session(olga)
    now[0] += 13 * 3600
    assert auth.identify([], "127.0.0.1", cookie).name is None
    assert auth.identify([], "127.0.0.1", "not-a-cookie") == Identity(None, "viewer")


def test_the_sessions_kept_are_bounded() -> None:
    auth = _auth()
    olga = Identity("olga", "operator")
    first = auth.start_session(olga)
    for _ in range(MAX_SESSIONS):
        auth.start_session(olga)
    assert auth.identify([], None, first).name is None
    assert len(auth._sessions) == MAX_SESSIONS


def test_short_keys_and_bad_proxies_refuse_to_start_naming_every_one() -> None:
    with pytest.raises(ConfigurationError) as e:
        Authenticator(
            keys={
                "bob": ("short", "admin"),
                "eve": ("x" * 15, "viewer"),
                "ok": ("y" * 16, "admin"),
            },
            trusted_proxies=["10.0.0.300"],
        )
    text = str(e.value)
    assert "'bob'" in text
    assert "'eve'" in text
    assert "'ok'" not in text
    assert "short" not in text.replace("shorter", "")  # never the key itself
    assert "'10.0.0.300' is not an address" in text
    with pytest.raises(ConfigurationError):
        _auth().add_key("bob", "short", "admin")


def test_roles_nest_and_name_what_an_action_needs() -> None:
    viewer, operator, admin = (
        Identity("v", "viewer"),
        Identity("o", "operator"),
        Identity("a", "admin"),
    )
    assert allowed(viewer, "retry") == "operator"
    assert allowed(operator, "retry") is None
    assert allowed(operator, "purge") == "admin"
    assert allowed(admin, "terminate") is None
    assert allowed(Identity(None, None), "replay") == "operator"
    assert allowed(admin, "unheard-of") is None
    assert allowed(operator, "unheard-of") == "admin"


def test_nobody_gets_nothing_when_anonymous_reading_is_off() -> None:
    closed = _auth(anonymous=None)
    assert not closed.open_to_anyone
    assert closed.identify([], "127.0.0.1", None) == Identity(None, None)
    assert not Identity(None, None).may("viewer")
    assert closed.authenticates
    assert not Authenticator().authenticates


def test_a_console_anyone_may_read_from_beyond_this_machine_is_warned_about() -> None:
    from processor._cli.operate import exposure

    assert exposure("127.0.0.1", "viewer") is None
    assert exposure("::1", "viewer") is None
    assert exposure("localhost", "viewer") is None
    assert exposure("0.0.0.0", None) is None  # nobody reads without signing in
    warning = exposure("0.0.0.0", "viewer")
    assert warning is not None
    assert "anyone who reaches it reads as a viewer" in warning
    assert "SAGA_CONSOLE__TRUSTED_PROXIES" in warning
