"""Talking to a running console the way its pages do: cookies kept, forms posted with the form
token of a page the same client just read."""

from __future__ import annotations

import re
from types import TracebackType
from typing import Any

import httpx

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class FormClient:
    """An HTTP client of the console at ``base`` that posts forms as its own pages would.

    Args:
        base: The console's base URL.
        **options: For :class:`httpx.Client` (``cookies``, ``headers``, ``transport``...).
    """

    def __init__(self, base: str, **options: Any) -> None:
        self.http = httpx.Client(base_url=base, timeout=30, **options)

    def token(self, page: str = "/login") -> str:
        """The form token of ``page``, as this client's cookies stand now."""
        found = _CSRF.search(self.http.get(page).text)
        assert found is not None, f"no form token on {page}"
        return found.group(1)

    def post(self, path: str, data: dict[str, str], **options: Any) -> httpx.Response:
        """Posts ``data`` with a fresh form token."""
        return self.http.post(path, data={**data, "csrf": self.token()}, **options)

    def sign_in(self, name: str, key: str) -> httpx.Response:
        """Signs in at ``/login``; the session cookie stays with this client."""
        return self.post("/login", {"name": name, "key": key})

    def __enter__(self) -> FormClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.http.close()
