"""One connection a store keeps between calls, reopened on the call after one broke."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import psycopg
from psycopg.rows import TupleRow

from processor.errors import Retryable, RuntimeFailure
from processor.postgres.errors import translate

__all__ = ["HeldConnection"]

Conn = psycopg.Connection[TupleRow]


class HeldConnection:
    """A lazily opened connection and the rule for what a driver error becomes.

    Args:
        connect: Opens a new connection.
    """

    def __init__(self, connect: Callable[[], Conn]) -> None:
        self._connect = connect
        self._conn: Conn | None = None

    def get(self) -> Conn:
        """The open connection; a new one when there is none or it was closed."""
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def failure(self, error: psycopg.Error) -> RuntimeFailure:
        """The runtime failure to raise for ``error``.

        A connection that broke is closed, so the next call reconnects, and the failure is
        ``Retryable`` whatever the server said last.
        """
        failure = translate(error)
        if self._conn is not None and (self._conn.broken or self._conn.closed):
            self.close()
            return Retryable(f"connection lost: {failure}")
        return failure

    def close(self) -> None:
        """Closes the connection, if open; a later :meth:`get` opens a new one."""
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None
