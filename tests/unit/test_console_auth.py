"""The console's identities and roles: a trusted proxy, signed sessions, keys, anonymity."""

from __future__ import annotations

from processor.console.auth import Authenticator, Identity, allowed

KEYS = {"olga": ("olga-key", "operator"), "ada": ("ada-key", "admin")}


def _auth(**kw: object) -> Authenticator:
    return Authenticator(keys=KEYS, **kw)  # type: ignore[arg-type]


def test_a_proxys_user_header_counts_only_from_the_proxy() -> None:
    auth = _auth(trusted_proxies=["10.0.0.0/8"], proxy_roles={"root": "admin"})
    headers = {"x-forwarded-user": "sam"}
    assert auth.identify(headers, "10.1.2.3", None) == Identity("sam", "viewer")
    assert auth.identify({"x-forwarded-user": "root"}, "10.1.2.3", None).role == "admin"
    # Anyone else could set the header themselves: ignored.
    assert auth.identify(headers, "192.168.1.5", None) == Identity(None, "viewer")
    assert auth.identify(headers, None, None) == Identity(None, "viewer")


def test_a_session_is_signed_and_expires() -> None:
    auth = _auth()
    olga = auth.sign_in("olga", "olga-key")
    assert olga == Identity("olga", "operator")
    assert auth.sign_in("olga", "ada-key") is None
    assert auth.sign_in("nobody", "") is None
    cookie = auth.cookie(olga, now=1000.0)
    assert auth._session(cookie, now=1001.0) == olga
    assert auth._session(cookie, now=1000.0 + 13 * 3600) is None
    _, sig = cookie.split(".")
    forged = auth.cookie(Identity("olga", "admin"), now=1000.0).split(".")[0] + "." + sig
    assert auth._session(forged, now=1001.0) is None
    # Another console process (another secret) does not take it either.
    assert _auth()._session(cookie, now=1001.0) is None
    assert auth.identify({}, "127.0.0.1", "not-a-cookie") == Identity(None, "viewer")


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
    assert closed.identify({}, "127.0.0.1", None) == Identity(None, None)
    assert not Identity(None, None).may("viewer")
    assert closed.authenticates
    assert not Authenticator().authenticates


def test_a_console_anyone_may_read_from_beyond_this_machine_is_warned_about() -> None:
    from processor.cli.operate import exposure

    assert exposure("127.0.0.1", "viewer") is None
    assert exposure("::1", "viewer") is None
    assert exposure("localhost", "viewer") is None
    assert exposure("0.0.0.0", None) is None  # nobody reads without signing in
    warning = exposure("0.0.0.0", "viewer")
    assert warning is not None
    assert "anyone who reaches it reads as a viewer" in warning
    assert "SAGA_CONSOLE__TRUSTED_PROXIES" in warning
