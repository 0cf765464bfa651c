"""The batch store's statements for tables distributed by bucket (Citus, ``buckets`` layout).

The same statements as :mod:`processor._postgres.batch.sql`, each carrying the ``bucket``
column (:mod:`processor._postgres.schema.buckets`): a row's bucket is written with it (the last
field of its JSON array, or an array of its own), and a statement that reads, updates or deletes
by saga names one bucket as a constant, ``bucket = %s``, so that Citus routes it to the one
worker that holds it. The store runs those once per bucket of the batch: once when the input
topics' partition counts are multiples of the bucket count.
"""

from processor._postgres.batch import sql

READ_OFFSETS = sql.READ_OFFSETS.replace(
    " WHERE group_id = %s", " WHERE bucket = %s::int AND group_id = %s"
)

LOCK_OWNED = """
SELECT 1 FROM {offsets}
 WHERE bucket = %s::int AND group_id = %s AND (topic, partition) IN
       (SELECT * FROM unnest(%b::text[], %b::int[]))
 ORDER BY topic, partition
   FOR UPDATE
"""

CLAIM = """
INSERT INTO {offsets} AS o (bucket, group_id, topic, partition, next_offset, owner_epoch,
                            owner, updated_at)
SELECT %s::int, %s, t, p, NULL, 1, %s, now() FROM unnest(%b::text[], %b::int[]) AS u(t, p)
ON CONFLICT (bucket, group_id, topic, partition) DO UPDATE
   SET owner_epoch = o.owner_epoch + 1, owner = excluded.owner,
       updated_at = excluded.updated_at
RETURNING topic, partition, owner_epoch, next_offset
"""

# The load's three reads of sql (LOAD_SAGAS, LOAD_TOMBSTONES, LOAD_APPLIED) for one bucket in
# one statement, each row tagged with its read (0: a saga, 1: a tombstone, 2: an applied
# message): Citus plans a statement on a bucket's worker on the coordinator and again on the
# worker, and the three reads were a third of S8's planning on the coordinator. One statement,
# one snapshot: a saga purged by retention (its instance deleted and its tombstone written in
# one transaction) is seen in exactly one of the two.
LOAD = """
SELECT 0 AS kind, s.saga_type, s.saga_id, s.state, s.status, s.version, s.parked_reason,
       s.state_version, NULL::text AS message_id
  FROM jsonb_array_elements(%(keys)s::jsonb) AS k CROSS JOIN LATERAL (
    SELECT saga_type, saga_id, state, status, version, parked_reason, state_version
      FROM {instance}
     WHERE bucket = %(bucket)s::int AND saga_type = k->>0 AND saga_id = k->>1 LIMIT 1) AS s
UNION ALL
SELECT 1, t.saga_type, t.saga_id, NULL, NULL, NULL, NULL, NULL, NULL
  FROM jsonb_array_elements(%(keys)s::jsonb) AS k CROSS JOIN LATERAL (
    SELECT saga_type, saga_id FROM {tombstone}
     WHERE bucket = %(bucket)s::int AND saga_type = k->>0 AND saga_id = k->>1 LIMIT 1) AS t
UNION ALL
SELECT 2, h.saga_type, h.saga_id, NULL, NULL, NULL, NULL, NULL, h.message_id
  FROM jsonb_array_elements(%(mkeys)s::jsonb) AS k CROSS JOIN LATERAL (
    SELECT saga_type, saga_id, message_id FROM {history}
     WHERE bucket = %(bucket)s::int AND outcome = 'applied' AND saga_type = k->>0
       AND saga_id = k->>1 AND message_id = k->>2 LIMIT 1) AS h
"""

INSERT_SAGAS = """
INSERT INTO {instance} (saga_type, saga_id, state, status, version, parked_reason,
                        ended_at, machine_state, machine_state_since, state_version, bucket)
SELECT t, i, s, st, v, pr, CASE WHEN st = 'ended' THEN now() END, ms,
       CASE WHEN ms IS NOT NULL THEN now() END, sv, b
  FROM (SELECT x->>0, x->>1, nullif(x->2, 'null'), x->>3, (x->>4)::bigint, x->>5,
               x->>6, (x->>7)::int, (x->>8)::int
          FROM jsonb_array_elements(%s::jsonb) AS x) AS u(t, i, s, st, v, pr, ms, sv, b)
"""

UPDATE_SAGAS = sql.UPDATE_SAGAS.replace(
    " WHERE x.saga_type = u.t", " WHERE x.bucket = %s::int AND x.saga_type = u.t"
)

INSERT_HISTORY = """
INSERT INTO {history} (saga_type, saga_id, message_id, message_type, kind, outcome,
                       version, topic, partition, "offset", detail, headers,
                       payload, payload_sha256, effects, bucket)
SELECT x->>0, x->>1, x->>2, x->>3, x->>4, x->>5, (x->>6)::bigint, x->>7,
       (x->>8)::int, (x->>9)::bigint, x->>10, nullif(x->11, 'null'), p, sha,
       nullif(x->12, 'null'), (x->>13)::int
  FROM ROWS FROM (jsonb_array_elements(%s::jsonb), unnest(%b::bytea[]),
                  unnest(%b::bytea[])) AS u(x, p, sha)
"""

INSERT_OUTBOX = """
INSERT INTO {outbox} (saga_type, saga_id, topic, partition, key, headers, value,
                      source_topic, source_partition, bucket)
SELECT x->>0, x->>1, x->>2, (x->>3)::int, k, x->4, v, x->5->>0, (x->5->>1)::int,
       (x->>6)::int
  FROM ROWS FROM (jsonb_array_elements(%s::jsonb), unnest(%b::bytea[]),
                  unnest(%b::bytea[])) AS u(x, k, v)
"""

CLEAR_DEADLINES = sql.CLEAR_DEADLINES.replace(
    " WHERE d.saga_type = u.t", " WHERE d.bucket = %s::int AND d.saga_type = u.t"
)
DELETE_DEADLINES = sql.DELETE_DEADLINES.replace(
    " WHERE d.saga_type = u.t", " WHERE d.bucket = %s::int AND d.saga_type = u.t"
)

INSERT_DEADLINES = """
INSERT INTO {deadline} (id, saga_type, saga_id, name, due_at, payload, topic, partition,
                        traceparent, tracestate, bucket)
SELECT (x->>0)::uuid, x->>1, x->>2, x->>3, (x->>4)::timestamptz, nullif(x->5, 'null'),
       x->>6, (x->>7)::int, x->>8, x->>9, (x->>10)::int
  FROM jsonb_array_elements(%s::jsonb) AS x
"""

INSERT_DEAD_LETTERS = """
INSERT INTO {dead_letter} (topic, partition, "offset", key, value, headers, reason,
                           detail, bucket)
SELECT * FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::bytea[], %b::bytea[],
                     %b::jsonb[], %b::text[], %b::text[], %b::int[])
"""

INSERT_PARKED = """
INSERT INTO {parked} (saga_type, saga_id, topic, partition, "offset", key, value,
                      headers, reason, bucket)
SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[], %b::bigint[],
                     %b::bytea[], %b::bytea[], %b::jsonb[], %b::text[], %b::int[])
"""

COMMIT_OFFSETS = sql.COMMIT_OFFSETS.replace(
    " WHERE o.group_id = %s", " WHERE o.bucket = %s::int AND o.group_id = %s"
)
