"""Wake-ups from other processes over PostgreSQL LISTEN/NOTIFY.

A replica's own commits wake its loops in-process; commits in other replicas arrive here. A
missed notification costs at most one poll interval, so the listener reconnects quietly.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg
from psycopg import sql

from processor._postgres.held import Conn

__all__ = ["PostgresWakeSource"]

log = logging.getLogger(__name__)


class PostgresWakeSource:
    """:class:`processor._ports.WakeSource` listening on one NOTIFY channel.

    Args:
        connect: Opens a new connection; the listener owns it (autocommit) while it runs.
        channel: The channel to LISTEN on, from :func:`processor._wire.outbox_channel` or
            :func:`processor._wire.deadline_channel`.
        ignore: A payload to skip: this process's own notifications, whose commits already
            woke its loops in-process (a second wake-up would only run an empty round).
    """

    def __init__(
        self, connect: Callable[[], Conn], channel: str, ignore: str | None = None
    ) -> None:
        self._connect = connect
        self.channel = channel
        self._ignore = ignore

    def run(self, stop: threading.Event, on_wake: Callable[[], None]) -> None:
        """Calls ``on_wake`` for each notification until ``stop`` is set; reconnects itself."""
        while not stop.is_set():
            try:
                with self._connect() as conn:
                    conn.autocommit = True
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    while not stop.is_set():
                        # A short timeout so that ``stop`` is seen within half a second.
                        for n in conn.notifies(timeout=0.5, stop_after=1):
                            if self._ignore is None or n.payload != self._ignore:
                                on_wake()
            except psycopg.Error as e:
                log.debug("notify listener on %s reconnecting: %s", self.channel, e)
                stop.wait(1.0)
