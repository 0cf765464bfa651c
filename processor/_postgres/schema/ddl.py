"""The DDL of every table the processor owns, as numbered migrations (applied by ``tables``).

Each entry of :data:`MIGRATIONS` is one migration; never edit a released one, append a new one.
Placeholders (``{instance}``, ``{history}``, ...) are filled with qualified names by
:meth:`processor._postgres.schema.tables.Tables.render`. The outbox tables' DDL is shared with a
participant's schema (:mod:`processor._postgres.schema.participant`), whose outbox has the same
shape.
"""

from __future__ import annotations

__all__ = [
    "MIGRATIONS",
    "citus_node_ddl",
    "failed_outbox_ddl",
    "outbox_ddl",
    "outbox_source_ddl",
]

# The columns an outbox row and a set-aside (failed) one share after their id, in table order.
_OUTBOX_ROW = """
        saga_type   text,
        saga_id     text,
        topic       text        NOT NULL,
        partition   int,
        key         bytea,
        headers     jsonb       NOT NULL,
        value       bytea       NOT NULL,"""


def outbox_ddl(*, retries: bool) -> str:
    """The outbox table's CREATE, as the processor's and a participant's schemas first make it.

    Both outboxes have one shape, so that one relay and one store publish either. Args:
    ``retries`` adds the retry columns (``attempts``, ``last_error``) that the processor's
    migration 4 added later and a participant's tables had from the start.
    """
    retry_columns = (
        ",\n        attempts    int         NOT NULL DEFAULT 0,\n        last_error  text"
        if retries
        else ""
    )
    return f"""
    -- Insert/delete churn: vacuum early so the queue's indexes stay small.
    CREATE TABLE {{outbox}} (
        id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,{_OUTBOX_ROW}
        created_at  timestamptz NOT NULL DEFAULT now(){retry_columns}
    ) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
    """


def failed_outbox_ddl() -> str:
    """The failed outbox's CREATE: rows the relay set aside, under their outbox ids."""
    return f"""
    CREATE TABLE {{failed_outbox}} (
        id          bigint      PRIMARY KEY,{_OUTBOX_ROW}
        created_at  timestamptz NOT NULL,
        reason      text        NOT NULL,
        attempts    int         NOT NULL,
        held_behind bigint,
        failed_at   timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX ON {{failed_outbox}} (saga_type, saga_id, id);
    """


def outbox_source_ddl(*, partitioned: bool) -> str:
    """The source partition columns of both outbox tables, and the outbox's indexes for them.

    Args:
        partitioned: Rows of an input partition are claimed by that partition's relay: their
            index comes before the two partial ones (index names are PostgreSQL's defaults,
            which later migrations name, so the order stays as released).
    """
    by_partition = (
        "\n    CREATE INDEX ON {outbox} (source_topic, source_partition, id);"
        if partitioned
        else ""
    )
    return f"""
    ALTER TABLE {{outbox}} ADD COLUMN source_topic     text,
                         ADD COLUMN source_partition int;
    ALTER TABLE {{failed_outbox}} ADD COLUMN source_topic     text,
                                ADD COLUMN source_partition int;{by_partition}
    CREATE INDEX ON {{outbox}} (id) WHERE source_topic IS NULL;
    CREATE INDEX ON {{outbox}} (saga_type, saga_id, id) WHERE source_topic IS NULL;
    """


def citus_node_ddl() -> str:
    """The table that records the one Citus node a schema's processes connect through.

    One row at most, written by the first connection on Citus
    (:func:`processor._postgres.schema.citus.pin_node`); it stays empty on a single PostgreSQL.
    """
    return """
    CREATE TABLE {citus_node} (
        one       boolean     PRIMARY KEY DEFAULT true CHECK (one),
        group_id  int         NOT NULL,
        node      text        NOT NULL,
        pinned_by text        NOT NULL,
        pinned_at timestamptz NOT NULL DEFAULT now()
    );
    """


# Each entry is one migration; never edit a released one, append a new one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE {instance} (
        saga_type   text        NOT NULL,
        saga_id     text        NOT NULL,
        state       jsonb,
        status      text        NOT NULL,
        version     bigint      NOT NULL,
        created_at  timestamptz NOT NULL DEFAULT now(),
        updated_at  timestamptz NOT NULL DEFAULT now(),
        ended_at    timestamptz,
        parked_reason text,
        PRIMARY KEY (saga_type, saga_id)
    );
    CREATE INDEX ON {instance} (status, updated_at);

    -- Audit trail. The partial unique index is the duplicate detector: one applied row per
    -- (saga, message id); duplicates and skipped records are recorded beside it.
    CREATE TABLE {history} (
        id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        saga_type    text        NOT NULL,
        saga_id      text        NOT NULL,
        message_id   text        NOT NULL,
        message_type text        NOT NULL,
        kind         text        NOT NULL,
        outcome      text        NOT NULL,
        version      bigint,
        topic        text,
        partition    int,
        "offset"     bigint,
        detail       text,
        at           timestamptz NOT NULL DEFAULT now()
    );
    CREATE UNIQUE INDEX ON {history} (saga_type, saga_id, message_id) WHERE outcome = 'applied';
    CREATE INDEX ON {history} (saga_type, saga_id, id);
    CREATE INDEX ON {history} (at);

    """
    + outbox_ddl(retries=False)
    + """
    CREATE TABLE {deadline} (
        id             uuid        PRIMARY KEY,
        saga_type      text        NOT NULL,
        saga_id        text        NOT NULL,
        name           text        NOT NULL,
        due_at         timestamptz NOT NULL,
        payload        jsonb,
        topic          text        NOT NULL,
        partition      int         NOT NULL,
        dispatched_at  timestamptz,
        dispatch_token bigint,
        created_at     timestamptz NOT NULL DEFAULT now(),
        UNIQUE (saga_type, saga_id, name)
    ) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
    CREATE INDEX ON {deadline} (due_at);

    CREATE TABLE {deadline_lock} (
        name       text        PRIMARY KEY,
        holder     text        NOT NULL,
        token      bigint      NOT NULL,
        expires_at timestamptz NOT NULL
    );

    CREATE TABLE {offsets} (
        group_id    text   NOT NULL,
        topic       text   NOT NULL,
        partition   int    NOT NULL,
        next_offset bigint,
        owner_epoch bigint NOT NULL,
        owner       text,
        updated_at  timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (group_id, topic, partition)
    );

    CREATE TABLE {dead_letter} (
        id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        topic      text        NOT NULL,
        partition  int         NOT NULL,
        "offset"   bigint      NOT NULL,
        key        bytea,
        value      bytea,
        headers    jsonb       NOT NULL,
        reason     text        NOT NULL,
        detail     text,
        created_at timestamptz NOT NULL DEFAULT now()
    );

    -- Messages held behind a parked saga, replayed in id order by an operator's retry.
    CREATE TABLE {parked} (
        id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        saga_type  text        NOT NULL,
        saga_id    text        NOT NULL,
        topic      text        NOT NULL,
        partition  int         NOT NULL,
        "offset"   bigint      NOT NULL,
        key        bytea,
        value      bytea       NOT NULL,
        headers    jsonb       NOT NULL,
        reason     text        NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX ON {parked} (saga_type, saga_id, id);
    """,
    # 2: the state machine state of sagas that are machines, and since when, for operators.
    """
    ALTER TABLE {instance} ADD COLUMN machine_state text,
                           ADD COLUMN machine_state_since timestamptz;
    CREATE INDEX ON {instance} (machine_state, machine_state_since)
     WHERE machine_state IS NOT NULL;
    """,
    # 3: undispatched deadlines in due order. The poller's claim walks only rows it may fire,
    # not the fired ones still waiting for their handler (after a burst, tens of thousands).
    """
    CREATE INDEX ON {deadline} (due_at) WHERE dispatched_at IS NULL;
    """,
    # i8relay
    # 4: rows the relay could not publish (too large, unknown topic, not authorized, or the same
    # transient error too many times), and the later rows of the same saga held behind them, so
    # that one row never stops every saga's commands. A row keeps its outbox id, so a retry puts
    # it back where it was in the commit order.
    """
    ALTER TABLE {outbox} ADD COLUMN attempts   int  NOT NULL DEFAULT 0,
                         ADD COLUMN last_error text;
    """
    + failed_outbox_ddl(),
    # 5: retention (processor/_runtime/retention.py). A purged ended saga leaves a tombstone, so
    # that a late or redelivered start event is recognised for the dedupe window instead of
    # starting a second saga. The indexes let each chunked delete find its oldest rows without
    # walking the rows it keeps.
    """
    CREATE TABLE {tombstone} (
        saga_type  text        NOT NULL,
        saga_id    text        NOT NULL,
        ended_at   timestamptz NOT NULL,
        purged_at  timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (saga_type, saga_id)
    );
    CREATE INDEX ON {tombstone} (ended_at);
    CREATE INDEX ON {instance} (ended_at) WHERE status = 'ended';
    CREATE INDEX ON {history} (at) WHERE outcome <> 'applied';
    CREATE INDEX ON {dead_letter} (created_at);
    CREATE INDEX ON {parked} (created_at);
    CREATE INDEX ON {failed_outbox} (failed_at);
    """,
    # 6: the saga class's state version each row was written at, so a newer class can upcast
    # older rows on load (processor._authoring.upcasting). A constant default adds no table rewrite.
    """
    ALTER TABLE {instance} ADD COLUMN state_version int NOT NULL DEFAULT 1;
    """,
    # 7 (console11): the audit trail (what each record held, what each step produced) and the
    # operator console's indexes: sagas by type and status in age order (dead letters by time
    # are indexed by 5).
    """
    ALTER TABLE {history} ADD COLUMN headers        jsonb,
                          ADD COLUMN payload        bytea,
                          ADD COLUMN payload_sha256 bytea,
                          ADD COLUMN effects        jsonb;
    CREATE INDEX ON {instance} (saga_type, status, updated_at);
    CREATE INDEX ON {instance} (updated_at, saga_type, saga_id);
    CREATE INDEX ON {instance} (saga_id);
    CREATE INDEX ON {instance} ((coalesce(machine_state_since, updated_at)))
     WHERE status <> 'ended';
    """,
    # 8 (metrics10): the W3C trace context of the input that set a deadline, so that its fired
    # record (and the commands that one causes) continue the same trace.
    """
    ALTER TABLE {deadline} ADD COLUMN traceparent text,
                           ADD COLUMN tracestate  text;
    """,
    # 9 (grow12): input topics that grew online. The partition count each consumer group knows
    # per topic, and each growth with its barrier: new partitions wait until the old ones are
    # consumed past the high watermarks taken once producers have switched
    # (processor/_engine/growth.py).
    """
    CREATE TABLE {partition_count} (
        group_id   text        NOT NULL,
        topic      text        NOT NULL,
        count      int         NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (group_id, topic)
    );
    CREATE TABLE {partition_growth} (
        group_id   text        NOT NULL,
        topic      text        NOT NULL,
        old_count  int         NOT NULL,
        new_count  int         NOT NULL,
        noticed_at timestamptz NOT NULL,
        barrier_at timestamptz NOT NULL,
        watermarks jsonb,
        taken_at   timestamptz,
        passed_at  timestamptz,
        PRIMARY KEY (group_id, topic, new_count)
    );
    """,
    # 10 (relay12): the input (topic, partition) whose record caused each outbox row, so that
    # the relay of that partition's owner publishes it, fenced by the owner's epoch. NULL for
    # rows written before and rows of no input partition: those keep the one-relay-at-a-time
    # path, which walks its own small index; partition rows wait behind older NULL rows of
    # their saga (the second partial index).
    outbox_source_ddl(partitioned=True),
    # 11: fewer index entries per saga write. Every write of a saga row (an UPDATE moves
    # updated_at, so none is HOT) adds an entry to each of its indexes. The (saga_id) index of
    # migration 7 only served the console's search by id alone, which now walks the primary key
    # once per saga type (processor/_postgres/reads/inspect.py); lookups by (saga_type, saga_id)
    # have the primary key. The name is the one PostgreSQL gave the index in migration 7.
    """
    DROP INDEX IF EXISTS "{schema}"."saga_instance_saga_id_idx";
    """,
    # 12: a partition row waits behind every older row of its saga from another source (another
    # partition after its input topic grew, or none), not only behind rows of no source: the
    # saga's index covers every row. It replaces migration 10's partial one, whose name is the
    # one PostgreSQL gave it, and takes that name.
    """
    DROP INDEX IF EXISTS "{schema}"."outbox_saga_type_saga_id_id_idx";
    CREATE INDEX outbox_saga_type_saga_id_id_idx ON {outbox} (saga_type, saga_id, id);
    """,
    # 13: the operators' trail. Every action that changes what the processor holds (a replayed
    # or purged dead letter, a failed outbox row retried or discarded, an operator record the
    # processor decided: a skip, a terminate, ...) is recorded in the transaction of its effect:
    # who, when, why, what (ids and counts) and how it ended. `show` reads a saga's entries by
    # (saga_type, saga_id, at); `audit list` reads the newest first by `at`. Rows are few (one per
    # action), so the saga index covers rows of no saga too rather than being partial.
    """
    CREATE TABLE {audit} (
        id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at        timestamptz NOT NULL DEFAULT now(),
        actor     text        NOT NULL,
        action    text        NOT NULL,
        reason    text,
        saga_type text,
        saga_id   text,
        target    jsonb       NOT NULL DEFAULT '{{}}',
        outcome   text        NOT NULL
    );
    CREATE INDEX ON {audit} (saga_type, saga_id, at);
    CREATE INDEX ON {audit} (at);
    """,
    # 14: the console's search by correlation id (processor/_postgres/reads/inspect.py): the events
    # that started sagas only (the history's applied version-1 rows), one entry per saga rather
    # than per event; the later events of a saga carry the id its commands passed on. The state
    # search (`customer_id=c-7`) has no index: a GIN index of the state would add about 40% WAL
    # to every saga write, the hot path, for an operator's occasional search (0.3-0.6 s a page
    # on a million sagas without it). Named, and IF NOT EXISTS, so that a large database can
    # build it beforehand with CREATE INDEX CONCURRENTLY instead of blocking writes meanwhile.
    """
    CREATE INDEX IF NOT EXISTS saga_history_correlation_idx ON {history}
     ((headers->>'correlation-id'))
     WHERE kind = 'event' AND outcome = 'applied' AND version = 1;
    """,
    # 15: fewer index entries per saga write (see 11). The console's list in age order reads
    # each (saga_type, status) pair's oldest rows from migration 7's (saga_type, status,
    # updated_at) index and merges them (processor/_postgres/reads/inspect.py), so the (status,
    # updated_at) and (updated_at, saga_type, saga_id) indexes go: every insert and update of a
    # saga paid an entry in each. Parked sagas, which operators list and count by themselves,
    # get an index of their own, which a saga enters only when it parks. The names dropped are
    # the ones PostgreSQL gave the indexes in migrations 1 and 7.
    """
    DROP INDEX IF EXISTS "{schema}"."saga_instance_status_updated_at_idx";
    DROP INDEX IF EXISTS "{schema}"."saga_instance_updated_at_saga_type_saga_id_idx";
    CREATE INDEX saga_instance_parked_idx ON {instance} (updated_at, saga_type, saga_id)
     WHERE status = 'parked';
    """,
    # 16: on Citus, the node every process of the schema connects through: identity values,
    # advisory locks and notifications are per node (processor/_postgres/schema/citus.py).
    citus_node_ddl(),
    # 17: fewer index entries per deadline. Every deadline scheduled paid an entry in migration
    # 1's (due_at) index, and every one fired another (setting dispatched_at moves the row out of
    # migration 5's partial index, so the update is not HOT). The poller's sweeps, its next-due
    # probe and the gauges read undispatched rows, which the partial (due_at) index holds; what
    # reads every row by due_at (the poller's full sweep after a leader change, `overdue`) is
    # rare and scans the table. The name is the one PostgreSQL gave the index in migration 1.
    """
    DROP INDEX IF EXISTS "{schema}"."saga_deadline_due_at_idx";
    """,
)
