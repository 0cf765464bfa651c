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
  back and the session is usable; unless the schema's tables were laid out anew since the
  connection opened (an operator's move to tables by bucket, with the replicas running: see
  ``layout``), which makes it ``Retryable`` on a new connection, whose statements fit the new
  tables.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Self

import psycopg
from psycopg.rows import TupleRow

from processor._engine.buckets import Buckets
from processor._errors import CommitInDoubt, Retryable, RuntimeFailure, Unreachable
from processor._postgres.errors import translate
from processor._postgres.schema.buckets import read_layout

__all__ = ["Conn", "HeldConnection", "OwnedConnection"]

log = logging.getLogger(__name__)

Conn = psycopg.Connection[TupleRow]

# What the server answers a statement made for other tables: refused data (a bucket column with
# no value), a feature it lacks (a row lock over several shards), an undefined object, an
# internal error (a relation dropped under a plan). Only these make the layout worth reading
# again: after a timeout or a client-side failure the server may not answer that read either.
_LAYOUT_STATES = ("22", "23", "0A", "42", "XX")


class HeldConnection:
    """A lazily opened connection and the rule for what a driver error becomes.

    Args:
        connect: Opens a new connection.
        setup: Prepares each new connection before its first use (autocommit, LISTEN); an
            error raised here counts as one of opening it.
        layout: Reads what the store's statements depend on in the tables' layout (see
            :func:`processor._postgres.schema.buckets.layout_mark`), once per connection and
            again after a failure that is not ``Retryable``: only an error can show that the
            tables changed under the statements, so the hot path pays nothing for it.
    """

    def __init__(
        self,
        connect: Callable[[], Conn],
        setup: Callable[[Conn], None] | None = None,
        layout: Callable[[Conn], object] | None = None,
    ) -> None:
        self._connect = connect
        self._setup = setup
        self._layout = layout
        self._mark: object = None
        self._conn: Conn | None = None
        self.opened = 0
        """How many connections were opened so far."""
        self._buckets: Buckets | None = None
        self._buckets_on = 0

    def get(self) -> Conn:
        """The open connection; a new one when there is none or it was closed or broke.

        Raises the driver's error when no connection could be opened: callers pass it to
        :meth:`failure` like any other.
        """
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            conn = self._connect()
            try:
                if self._setup is not None:
                    self._setup(conn)
                if self._layout is not None:
                    self._mark = self._read_layout(conn)
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
                raise
            self._conn = conn
            self.opened += 1
        return self._conn

    def buckets(self, conn: Conn, schema: str) -> Buckets | None:
        """``schema``'s bucket layout (None: not distributed by bucket), read once per connection.

        Read again on each new connection: an operator may have moved the tables to buckets
        while the store ran, and a statement that met the new tables made this one anew (see
        ``layout``).
        """
        if self._buckets_on != self.opened:
            if conn.autocommit:
                with conn.transaction():
                    self._buckets = read_layout(conn, schema)
            else:
                self._buckets = read_layout(conn, schema)
            self._buckets_on = self.opened
        return self._buckets

    @property
    def buckets_read(self) -> bool:
        """Whether :meth:`buckets` read the layout on the connection held now."""
        return self.opened > 0 and self._buckets_on == self.opened

    @property
    def known_buckets(self) -> Buckets | None:
        """The layout :meth:`buckets` read last; None before it first did."""
        return self._buckets

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
            return Unreachable(f"database connection lost: {failure}")
        if isinstance(failure, Retryable):
            self.close()
        elif (error.sqlstate or "").startswith(_LAYOUT_STATES) and self._laid_out_anew():
            self.close()
            return Retryable(
                "the schema's tables were laid out anew (moved to tables by bucket) since this "
                f"connection opened; its statements are made again on a new one: {failure}"
            )
        return failure

    def _read_layout(self, conn: Conn) -> object:
        assert self._layout is not None
        if conn.autocommit:
            return self._layout(conn)
        with conn.transaction():
            return self._layout(conn)

    def _laid_out_anew(self) -> bool:
        """Whether the layout read now differs from the connection's (when it can be read)."""
        conn = self._conn
        if self._layout is None or conn is None:
            return False
        # Only between transactions: the failed one has rolled back when the failure is built.
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return False
        try:
            return self._read_layout(conn) != self._mark
        except psycopg.Error as e:
            log.debug("the tables' layout could not be read after a failure: %s", e)
            return False

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
