"""The HTTP endpoint: /metrics (Prometheus text format), /healthz and /readyz.

A small threaded server from the standard library, on a daemon thread of its own (not a
supervised loop: it must keep answering while the processor shuts down, so that a probe sees
the failure that ends it).
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from processor._errors import SagaError
from processor._observe.health import Probe

__all__ = ["ObserveServer", "check_port_free"]

log = logging.getLogger(__name__)


class ObserveServer:
    """Serves the registry and the probes on ``host:port`` (port 0: any free port).

    Args:
        registry: What /metrics exposes.
        healthz: Answers /healthz.
        readyz: Answers /readyz.
        host: The address to bind.
        port: The port to bind; 0 picks a free one (see :attr:`port` after :meth:`start`).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        healthz: Callable[[], Probe],
        readyz: Callable[[], Probe],
        *,
        host: str,
        port: int,
    ) -> None:
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": lambda: _probe(healthz),
            "/readyz": lambda: _probe(readyz),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    status, ctype, body = 404, "text/plain", b"not found\n"
                else:
                    try:
                        status, ctype, body = route()
                    except Exception:
                        log.warning("%s failed", self.path, exc_info=True)
                        status, ctype, body = 500, "text/plain", b"error\n"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("%s " + format, self.address_string(), *args)

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise _in_use(host, port, e) from e
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Serves on a daemon thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="observe-http"
        )
        self._thread.daemon = True
        self._thread.start()

    def close(self) -> None:
        """Stops serving and releases the port."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()


def check_port_free(host: str, port: int) -> None:
    """Fails at startup, before anything runs, when ``host:port`` cannot be bound.

    Raises:
        SagaError: Another process holds the port (a second replica on the same host with the
            default port, say); the message names the setting to change.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # As the server binds: a port left in TIME_WAIT by a previous run is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise _in_use(host, port, e) from e


def _in_use(host: str, port: int, error: OSError) -> Exception:
    if error.errno != errno.EADDRINUSE:
        return error
    return SagaError(
        f"the metrics endpoint cannot listen on {host}:{port}: another process uses the port; "
        "set SAGA_METRICS__PORT to a free port (0 turns the endpoint off)"
    )


def _probe(fn: Callable[[], Probe]) -> tuple[int, str, bytes]:
    probe = fn()
    body = (json.dumps(probe.detail, default=str) + "\n").encode()
    return (200 if probe.ok else 503), "application/json", body
