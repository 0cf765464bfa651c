"""Sessions of a frozen replica that the server never ends on its own.

The server bounds how long a session may hold its transaction's locks while its client is away:
`idle_in_transaction_session_timeout` ends one that waits between statements, and
`statement_timeout` cancels a statement that runs too long. Neither covers a client frozen
(SIGSTOP, a paused VM) in the middle of sending a statement. libpq sends a statement larger
than its 8 kB buffer in pieces, and the server starts on its Parse message as soon as that
arrives: the session is then "active", reading the rest from its client. No idle timer is armed
until the statement's Sync, and the server holds a cancel back while it reads a message (it
would lose its place in the protocol), so the statement timeout fires but is acted on only once
the client sends the rest. The client's kernel answers keepalives, so TCP never gives up either.
Such a session keeps its row locks for as long as its process stays frozen.

A pipeline leaves the same gap, twice. Between its statements the session is "active" as above
(no Sync yet). After its Sync, psycopg sends a flush request: the server reads it as a message,
which stops the idle timer its Sync had started, and starts no other. A process frozen right
after a pipeline thus sits "idle in transaction" with no timer to end it. The tables distributed
over Citus write a batch's rows as a pipeline of statements.

The partitions' next owner finds it holding their offsets rows and ends it, once it has sat so
for longer than the idle bound the server would have applied to it between statements. Only a
session that wrote to the offsets table counts (a batch's compare-and-set, a claim): a relay only
reads its rows. Ending it rolls its transaction back; the frozen batch was fenced out by the
claim anyway.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import psycopg

from processor._postgres.held import Conn

__all__ = ["end_stuck_holders"]

log = logging.getLogger(__name__)

# Only the processor's own sessions (named "saga:<replica>") that wrote to the table, only one
# waiting on its client mid-statement or idle in its transaction, only past the bound, and only
# sessions this role may signal. A live client sends a statement's pieces microseconds apart, and
# the server itself ends a session idle that long whose timer runs.
_STUCK = """
SELECT a.pid, a.application_name, a.state, extract(epoch FROM now() - a.state_change)::int,
       pg_terminate_backend(a.pid)
  FROM pg_stat_activity AS a
 WHERE a.pid <> pg_backend_pid()
   AND a.pid IN (SELECT pid FROM pg_locks
                  WHERE relation = %(table)s::regclass AND mode = 'RowExclusiveLock' AND granted)
   AND a.state IN ('active', 'idle in transaction')
   AND a.wait_event = 'ClientRead'
   AND a.application_name LIKE 'saga:%%'
   AND a.state_change < now() - %(after)s
   AND (pg_has_role(a.usesysid, 'MEMBER') OR pg_has_role('pg_signal_backend', 'MEMBER'))
"""


def end_stuck_holders(conn: Conn, table: str, after: timedelta) -> list[str]:
    """Ends the sessions that wrote to ``table`` and have been stuck for longer than ``after``.

    Stuck: mid-statement, or idle in their transaction with no timer running (see above).

    Args:
        conn: A connection, not in a failed transaction (a transaction of its own is used).
        table: The qualified table whose lock holders are looked at.
        after: How long a session may sit waiting on its client in its transaction.

    Returns:
        One line per session ended, for the caller's message (empty when none was).
    """
    try:
        with conn.transaction():
            rows = conn.execute(_STUCK, {"table": table, "after": after}).fetchall()
    except psycopg.Error as e:
        log.warning("could not look for sessions stuck mid-statement on %s: %s", table, e)
        return []
    ended = []
    for pid, app, state, seconds, done in rows:
        where = "mid-statement" if state == "active" else "idle in its transaction"
        what = f"pid {pid} ({app}), {seconds} s {where} waiting on its client"
        if done:
            log.warning(
                "ended session %s, which held %s's rows: its process is frozen, and the server "
                "ends no session in that state on its own",
                what,
                table,
            )
            ended.append(f"ended {what}")
    return ended
