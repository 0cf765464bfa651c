"""How the console is served: uvicorn, judging the socket's peer itself.

uvicorn by default replaces the client address with ``X-Forwarded-For`` when the peer is
127.0.0.1, so anything on the console's own machine could pass as any address, the trusted
proxy's included. The console decides whom to trust from the socket peer
(:mod:`processor._console.auth`), so that rewriting is off here.
"""

from __future__ import annotations

from typing import Any

import uvicorn

__all__ = ["server_config"]


def server_config(app: Any, host: str, port: int, **options: Any) -> uvicorn.Config:
    """The uvicorn configuration for the console ``app`` on ``host``:``port``."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        proxy_headers=False,
        server_header=False,
        **{"log_level": "warning", **options},
    )
