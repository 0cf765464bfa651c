"""One connection a store keeps between calls, reopened on the call after one broke.

Every store of this package that keeps a connection of its own (the consumer's batches, the
relay, the deadline poller, the growth watch, retention, a participant, the gauges) holds it
here, so that they all follow one rule for when a connection is given up:

- a connection found closed or broken when a call starts is replaced by a new one;
- after a driver error, a connection that broke or was closed is dropped, and the failure is
  ``Retryable`` whatever the server said last (e.g. its idle-in-transaction timeout ended the
  session): only a new connection can run the next call;
- a ``Retryable`` failure on a connection that still looks open drops it too: the server may
  have ended the session (57P01, a statement cancelled while it shut down) before the client
  read the end of the socket, and a new connection costs little next to the retry;
- any other failure (refused data, a fatal error) keeps the connection: the transaction rolled
  back and the session is usable.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Self

import psycopg
from psycopg.rows import TupleRow

from processor._errors import CommitInDoubt, Retryable, RuntimeFailure
from processor._postgres.errors import translate

__all__ = ["Conn", "HeldConnection", "OwnedConnection"]

log = logging.getLogger(__name__)

Conn = psycopg.Connection[TupleRow]


class HeldConnection:
    """A lazily opened connection and the rule for what a driver error becomes.

    Args:
        connect: Opens a new connection.
        setup: Prepares each new connection before its first use (autocommit, LISTEN); an
            error raised here counts as one of opening it.
    """

    def __init__(
        self, connect: Callable[[], Conn], setup: Callable[[Conn], None] | None = None
    ) -> None:
        self._connect = connect
        self._setup = setup
        self._conn: Conn | None = None
        self.opened = 0
        """How many connections were opened so far."""

    def get(self) -> Conn:
        """The open connection; a new one when there is none or it was closed or broke.

        Raises the driver's error when no connection could be opened: callers pass it to
        :meth:`failure` like any other.
        """
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            conn = self._connect()
            if self._setup is not None:
                try:
                    self._setup(conn)
                except BaseException:
                    with contextlib.suppress(psycopg.Error):
                        conn.close()
                    raise
            self._conn = conn
            self.opened += 1
        return self._conn

    @property
    def lost(self) -> bool:
        """Whether the held connection broke or was closed."""
        return self._conn is not None and (self._conn.broken or self._conn.closed)

    def failure(self, error: psycopg.Error, *, committing: bool = False) -> RuntimeFailure:
        """The runtime failure to raise for ``error``, after applying the module's rule.

        Args:
            error: What the driver raised.
            committing: The error met a COMMIT already sent: a lost connection then leaves the
                outcome unknown (``CommitInDoubt``).
        """
        failure = translate(error)
        if self.lost:
            self.close()
            if committing:
                return CommitInDoubt(f"connection lost during COMMIT: {failure}")
            return Retryable(f"database connection lost: {failure}")
        if isinstance(failure, Retryable):
            self.close()
        return failure

    @contextlib.contextmanager
    def session(self) -> Iterator[Conn]:
        """The connection for one call; a driver error leaving the block becomes its failure."""
        try:
            yield self.get()
        except psycopg.Error as e:
            raise self.failure(e) from e

    def close(self) -> None:
        """Closes the connection, if open; a later :meth:`get` opens a new one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error as e:  # already broken: nothing left to release
                log.debug("closing a broken connection: %s", e)


class OwnedConnection:
    """Queries on one connection the caller opened for them; closing them closes it.

    For one-off commands (operators, the console), which open a connection, run their queries
    and close it, in a ``with`` block.

    Args:
        conn: The connection.
    """

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
