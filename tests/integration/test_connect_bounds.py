"""Every connection bounds how long a call can wait on a peer that went silent."""

from __future__ import annotations

import pytest

from processor._postgres.connect import TCP_BOUNDS, connect

pytestmark = pytest.mark.integration


def test_a_connection_carries_keepalives_and_a_tcp_user_timeout(database_url: str) -> None:
    with connect(database_url) as conn:
        params = conn.info.get_parameters()
        assert conn.execute("SELECT 1").fetchone() == (1,)
    for name, value in TCP_BOUNDS.items():
        assert params.get(name) == str(value), name
    assert int(params["tcp_user_timeout"]) <= 30_000


def test_a_bound_given_in_the_url_wins(database_url: str) -> None:
    sep = "&" if "?" in database_url else "?"
    with connect(f"{database_url}{sep}keepalives_idle=7") as conn:
        params = conn.info.get_parameters()
    assert params["keepalives_idle"] == "7"
    assert params["tcp_user_timeout"] == str(TCP_BOUNDS["tcp_user_timeout"])
