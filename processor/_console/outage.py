"""Pages while the database is out of reach: 503 with one line, as ``/readyz`` answers.

Every page and action opens its own database connection; when that cannot be had, the request
is answered here, in one place, instead of a bare 500 with a traceback in the log. What counts
as out of reach is :func:`processor._bootstrap.errors.unreachable`'s judgement (a connection
refused, timed out or dropped; the broker not answering an action). Any other failure is left
to the server, as before.
"""

from __future__ import annotations

import logging

from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from processor._bootstrap.errors import unreachable

__all__ = ["Unreachable"]

log = logging.getLogger(__name__)


class Unreachable:
    """ASGI middleware: a request that found the database out of reach is answered 503.

    The answer is one line naming what is away (JSON ``{"error": ...}`` under ``/api/``), never
    the connection's details; the log gets one WARNING line with them and no traceback.
    """

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serves one request, answering 503 if it failed for want of the database."""
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._app(scope, receive, watched)
        except Exception as e:
            line = unreachable(e)
            # Half an answer already sent cannot become a 503: the server ends it.
            if line is None or started:
                raise
            path: str = scope.get("path", "")
            method = scope.get("method", "?")
            log.warning("console: %s %r answered 503: %s", method, path[:200], line)
            # The line without its detail: the database's address is not every reader's business.
            text = line.split(":", 1)[0]
            answer: Response = (
                JSONResponse({"error": text}, 503)
                if path.startswith("/api/")
                else PlainTextResponse(text, 503)
            )
            await answer(scope, receive, send)
