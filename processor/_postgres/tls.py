"""Whether a database URL protects the connection: verified TLS, or a host on this machine.

The processor warns at startup otherwise. It still starts: a private network may be trusted on
purpose, but nobody should run that way by accident.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping

from psycopg.conninfo import conninfo_to_dict

log = logging.getLogger(__name__)

_LOCAL_NAMES = frozenset({"", "localhost"})


def _is_local(host: str) -> bool:
    # A path is a Unix-domain socket: the connection never leaves the machine.
    if host.startswith("/") or host.strip().lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def unverified_tls(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why connections made with `url` are open to eavesdropping or impersonation, or None.

    Verified means `sslmode=verify-full` (the server's certificate chains to a trusted root and
    names the host); `require` and `verify-ca` encrypt but accept an impostor's certificate for
    another name. A loopback host or a Unix socket needs no TLS.

    Args:
        url: A libpq URL or key=value connection string.
        environ: Where `PGSSLMODE`/`PGHOST` are read when the URL does not set them
            (defaults to `os.environ`, as libpq does).
    """
    env = os.environ if environ is None else environ
    try:
        params = conninfo_to_dict(url)
    except Exception:  # a malformed URL fails on connect, with libpq's own message
        return None
    hosts = str(params.get("host") or env.get("PGHOST", "")).split(",")
    remote = [h for h in hosts if not _is_local(h)]
    if not remote:
        return None
    mode = str(params.get("sslmode") or env.get("PGSSLMODE", "prefer"))
    if mode == "verify-full":
        return None
    return (
        f"the database connection to {', '.join(remote)} uses sslmode={mode}: the server's "
        "identity is not verified; use sslmode=verify-full (with sslrootcert) outside loopback"
    )


def warn_unverified_tls(url: str) -> None:
    """Logs a warning when `url` reaches a remote host without verified TLS."""
    reason = unverified_tls(url)
    if reason is not None:
        log.warning("%s", reason)
