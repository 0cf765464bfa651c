"""Connections to the processor's database."""

from __future__ import annotations

from datetime import timedelta

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow
from psycopg.types.json import set_json_loads
from pydantic_core import from_json

from processor._engine.partitioner import Partitioner
from processor._postgres.schema.citus import pin_node
from processor._postgres.schema.tables import Tables, migrate
from processor.settings._database import Distributed

TCP_BOUNDS: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
"""libpq connection parameters that bound how long a call waits on a silent peer."""


def connect(
    url: str,
    *,
    application_name: str = "saga-processor",
    autocommit: bool = False,
    idle_in_transaction_timeout: timedelta | None = None,
    statement_timeout: timedelta | None = None,
    keyed: bool = False,
    search_path: str | None = None,
    pin: str | None = None,
) -> psycopg.Connection[TupleRow]:
    """A connection with the processor's defaults (UTC session, bounded statement wait).

    Args:
        url: The database URL.
        application_name: Shown in `pg_stat_activity`.
        autocommit: Whether each statement commits on its own.
        idle_in_transaction_timeout: When set, the server ends this session if it leaves a
            transaction open and idle that long. A frozen process (paused, swapped out,
            partitioned) would otherwise keep the row and advisory locks that another replica
            needs to take over its work, for as long as it stays frozen.
        statement_timeout: When set, the server cancels a statement that runs longer: a loop
            whose query meets a table far larger than planned for (or a plan gone bad) fails
            that round and says so, rather than hold its connection and locks indefinitely.
        keyed: Every statement on this connection looks rows up by their keys (a batch's
            reads and writes): the planner is told to probe an index per key. Its statistics
            lag behind a table that fills fast (a young database, a burst of new sagas), and a
            table that still looks empty gets a batch's keys hashed against a scan of all of it,
            which costs each batch the whole table. Sequential scans, hash joins and merge joins
            are then only taken where nothing else can run.
        search_path: A schema that unqualified names find first (then ``public``): a
            participant service's handlers name their own tables without the schema.
        pin: The schema this connection writes, for a process of it: on Citus, the connection
            must reach the node the schema's processes use
            (:func:`processor._postgres.schema.citus.pin_node`).

    Raises:
        CitusNodeMismatch: ``pin`` is given and the connection reached another node (it is
            closed).
    """
    options = "-c timezone=UTC -c lock_timeout=30s"
    if idle_in_transaction_timeout is not None:
        ms = max(1, int(idle_in_transaction_timeout.total_seconds() * 1000))
        options += f" -c idle_in_transaction_session_timeout={ms}"
    if statement_timeout is not None:
        options += f" -c statement_timeout={max(1, int(statement_timeout.total_seconds() * 1000))}"
    if keyed:
        options += " -c enable_seqscan=off -c enable_hashjoin=off -c enable_mergejoin=off"
    if search_path is not None:
        # Quoted as an identifier, and its spaces escaped for the options string.
        quoted = '"' + search_path.replace('"', '""') + '"'
        options += " -c search_path=" + (quoted + ",public").replace(" ", "\\ ")
    given = conninfo_to_dict(url)
    # A peer that vanished without a FIN or RST (packets dropped by a partition, a host gone)
    # leaves a blocked call waiting on TCP retransmission for ~15 minutes by the kernel's
    # defaults. These bound it near half a minute: keepalive probes find a silent peer while a
    # call waits for an answer, and the user timeout ends one whose sent data stays unacked.
    # A value in the URL wins.
    bounds = {k: v for k, v in TCP_BOUNDS.items() if k not in given}
    conn = psycopg.connect(
        make_conninfo(url, **bounds),
        autocommit=autocommit,
        application_name=application_name,
        options=options,
        connect_timeout=10,
    )
    # pydantic-core's parser is several times faster than json.loads for jsonb columns.
    set_json_loads(from_json, conn)
    if pin is not None:
        try:
            pin_node(conn, pin, application_name)
        except BaseException:
            conn.close()
            raise
    return conn


def database_name(url: str) -> str:
    """The database a URL names (libpq's default, the user's name, when it names none)."""
    try:
        given = conninfo_to_dict(url)
    except psycopg.Error:
        return "?"
    return str(given.get("dbname") or given.get("user") or "?")


def ensure_schema(
    url: str,
    tables: Tables,
    distributed: Distributed = "auto",
    *,
    buckets: int | None = None,
    partitioner: Partitioner = "crc32",
    move: bool = False,
) -> int:
    """Creates or upgrades the schema (on Citus, distributed: see `migrate`); its version."""
    with connect(url, application_name="saga-processor-migrate") as conn:
        return migrate(
            conn, tables, distributed, buckets=buckets, partitioner=partitioner, move=move
        )
