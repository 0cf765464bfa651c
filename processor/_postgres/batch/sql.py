"""The batch store's SQL, as templates over the processor's tables (see `Tables.render`).

`processor._postgres.batch.store.BatchSql` renders each once per connection. The hot statements take
the batch's rows as one JSON array of arrays read with `jsonb_array_elements` (fields by position:
``x->>0`` is the first); the rarer ones take binary arrays over `unnest`.
"""

# FOR UPDATE, not the FOR NO KEY UPDATE the upsert takes: it waits for a relay claim
# in flight on these partitions (FOR KEY SHARE at the old epoch) to end, so the old
# owner's relay has published and committed (or rolled back) before the epoch moves.
# The owner's own offset updates (FOR NO KEY UPDATE) do not wait for the relay.
LOCK_OWNED = """
SELECT 1 FROM {offsets}
 WHERE group_id = %s AND (topic, partition) IN
       (SELECT * FROM unnest(%b::text[], %b::int[]))
 ORDER BY topic, partition
   FOR UPDATE
"""

# The time comes in the proposed row (excluded.updated_at): Citus runs a conflict's update
# only with immutable functions in it.
CLAIM = """
INSERT INTO {offsets} AS o (group_id, topic, partition, next_offset, owner_epoch, owner,
                            updated_at)
SELECT %s, t, p, NULL, 1, %s, now() FROM unnest(%b::text[], %b::int[]) AS u(t, p)
ON CONFLICT (group_id, topic, partition) DO UPDATE
   SET owner_epoch = o.owner_epoch + 1, owner = excluded.owner,
       updated_at = excluded.updated_at
RETURNING topic, partition, owner_epoch, next_offset
"""

READ_OFFSETS = """
SELECT topic, partition, owner_epoch, next_offset FROM {offsets}
 WHERE group_id = %s AND (topic, partition) IN
       (SELECT * FROM unnest(%b::text[], %b::int[]))
"""

# The batch's keys go as one JSON array of [type, id(, message id)] arrays: encoding
# them is one call into pydantic-core, where an array parameter per key part costs a
# Python step per value to build and another to dump.
# Each key is one index probe: a LATERAL subquery with LIMIT 1 (a key has at most one
# row) cannot be turned into a join. As a join (``IN (SELECT ...)``), a table whose
# statistics still say "small" (a young or fast-growing one) was planned as a hash of
# every applied history row: each batch then read the whole history (seen at 20,000
# rows: 8.8 ms of a 9 ms load, growing with the table).
LOAD_SAGAS = """
SELECT s.* FROM jsonb_array_elements(%s::jsonb) AS k CROSS JOIN LATERAL (
    SELECT saga_type, saga_id, state, status, version, parked_reason, state_version
      FROM {instance}
     WHERE saga_type = k->>0 AND saga_id = k->>1 LIMIT 1) AS s
"""

LOAD_TOMBSTONES = """
SELECT t.* FROM jsonb_array_elements(%s::jsonb) AS k CROSS JOIN LATERAL (
    SELECT saga_type, saga_id FROM {tombstone}
     WHERE saga_type = k->>0 AND saga_id = k->>1 LIMIT 1) AS t
"""

LOAD_APPLIED = """
SELECT h.* FROM jsonb_array_elements(%s::jsonb) AS k CROSS JOIN LATERAL (
    SELECT saga_type, saga_id, message_id FROM {history}
     WHERE outcome = 'applied' AND saga_type = k->>0 AND saga_id = k->>1
       AND message_id = k->>2 LIMIT 1) AS h
"""

# The operator records of a batch decided before, whatever the outcome (rows.DECIDED, spelt
# out): a copy sent again is a duplicate even when the first met no saga or was refused. Run
# only for a batch that holds operator records; each key is a probe of the saga's rows through
# the (saga_type, saga_id, id) index. Retention deletes the rows that applied nothing after
# SAGA_RETENTION__HISTORY (days), when a copy is long refused as expired anyway (minutes).
LOAD_DECIDED = """
SELECT h.* FROM jsonb_array_elements(%s::jsonb) AS k CROSS JOIN LATERAL (
    SELECT saga_type, saga_id, message_id FROM {history}
     WHERE saga_type = k->>0 AND saga_id = k->>1 AND message_id = k->>2
       AND outcome IN ('applied', 'no-saga', 'ignored-ended', 'operator-refused', 'skipped')
     LIMIT 1) AS h
"""

LOAD_DEADLINES = """
SELECT id::text, saga_type, saga_id, name, due_at, payload, dispatch_token
  FROM {deadline} WHERE id = ANY(%b::uuid[])
"""

LOAD_LEASE = "SELECT token FROM {deadline_lock} WHERE name = %s"

INSERT_SAGAS = """
INSERT INTO {instance} (saga_type, saga_id, state, status, version, parked_reason,
                        ended_at, machine_state, machine_state_since, state_version)
SELECT t, i, s, st, v, pr, CASE WHEN st = 'ended' THEN now() END, ms,
       CASE WHEN ms IS NOT NULL THEN now() END, sv
  FROM (SELECT x->>0, x->>1, nullif(x->2, 'null'), x->>3, (x->>4)::bigint, x->>5,
               x->>6, (x->>7)::int
          FROM jsonb_array_elements(%s::jsonb) AS x) AS u(t, i, s, st, v, pr, ms, sv)
"""

# The time is a column of the rows (u.now), not now() in the CASEs: Citus refuses a CASE or
# coalesce that calls a function that is not immutable. OFFSET 0 keeps the planner from
# folding the subquery, and with it now(), back into them.
UPDATE_SAGAS = """
UPDATE {instance} AS x
   SET state = u.s, status = u.st, version = u.v, parked_reason = u.pr,
       updated_at = u.now,
       ended_at = CASE WHEN u.st = 'ended' THEN coalesce(x.ended_at, u.now) END,
       machine_state = u.ms,
       machine_state_since = CASE WHEN u.ms IS DISTINCT FROM x.machine_state
                                  THEN u.now ELSE x.machine_state_since END,
       state_version = u.sv
  FROM (SELECT x->>0, x->>1, nullif(x->2, 'null'), x->>3, (x->>4)::bigint, x->>5,
               (x->>6)::bigint, x->>7, (x->>8)::int, now()
          FROM jsonb_array_elements(%s::jsonb) AS x OFFSET 0)
       AS u(t, i, s, st, v, pr, expected, ms, sv, now)
 WHERE x.saga_type = u.t AND x.saga_id = u.i AND x.version = u.expected
"""

# Everything but the bytes as one JSON array per row; the record's bytes as binary
# arrays beside it, zipped in order by ROWS FROM (ids are assigned in planning order).
INSERT_HISTORY = """
INSERT INTO {history} (saga_type, saga_id, message_id, message_type, kind, outcome,
                       version, topic, partition, "offset", detail, headers,
                       payload, payload_sha256, effects)
SELECT x->>0, x->>1, x->>2, x->>3, x->>4, x->>5, (x->>6)::bigint, x->>7,
       (x->>8)::int, (x->>9)::bigint, x->>10, nullif(x->11, 'null'), p, sha,
       nullif(x->12, 'null')
  FROM ROWS FROM (jsonb_array_elements(%s::jsonb), unnest(%b::bytea[]),
                  unnest(%b::bytea[])) AS u(x, p, sha)
"""

INSERT_OUTBOX = """
INSERT INTO {outbox} (saga_type, saga_id, topic, partition, key, headers, value,
                      source_topic, source_partition)
SELECT x->>0, x->>1, x->>2, (x->>3)::int, k, x->4, v, x->5->>0, (x->5->>1)::int
  FROM ROWS FROM (jsonb_array_elements(%s::jsonb), unnest(%b::bytea[]),
                  unnest(%b::bytea[])) AS u(x, k, v)
"""

CLEAR_DEADLINES = """
DELETE FROM {deadline} AS d
 USING (SELECT k->>0, k->>1 FROM jsonb_array_elements(%s::jsonb) AS k) AS u(t, i)
 WHERE d.saga_type = u.t AND d.saga_id = u.i
"""

DELETE_DEADLINES = """
DELETE FROM {deadline} AS d
 USING (SELECT k->>0, k->>1, k->>2 FROM jsonb_array_elements(%s::jsonb) AS k)
       AS u(t, i, n)
 WHERE d.saga_type = u.t AND d.saga_id = u.i AND d.name = u.n
"""

INSERT_DEADLINES = """
INSERT INTO {deadline} (id, saga_type, saga_id, name, due_at, payload, topic, partition,
                        traceparent, tracestate)
SELECT (x->>0)::uuid, x->>1, x->>2, x->>3, (x->>4)::timestamptz, nullif(x->5, 'null'),
       x->>6, (x->>7)::int, x->>8, x->>9
  FROM jsonb_array_elements(%s::jsonb) AS x
"""

INSERT_DEAD_LETTERS = """
INSERT INTO {dead_letter} (topic, partition, "offset", key, value, headers, reason,
                           detail)
SELECT * FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::bytea[], %b::bytea[],
                     %b::jsonb[], %b::text[], %b::text[])
"""

RESET_DEADLINES = """
UPDATE {deadline} AS d SET dispatched_at = NULL
  FROM unnest(%b::uuid[], %b::bigint[]) AS u(i, t)
 WHERE d.id = u.i AND d.dispatch_token = u.t
"""

# An operator's retry replays the records held behind the saga, with the deadline rows
# its held fired deadlines name.
LOAD_HELD = """
SELECT saga_type, saga_id, id, topic, partition, "offset", key, value, headers
  FROM {parked}
 WHERE (saga_type, saga_id) IN (SELECT * FROM unnest(%b::text[], %b::text[]))
 ORDER BY id
"""

# An operator's reset rebuilds the saga from its applied inputs, through the (saga_type,
# saga_id, id) index; replayed rows are those of an earlier reset.
LOAD_HISTORY = """
SELECT saga_type, saga_id, message_id, message_type, kind, outcome, version, topic,
       partition, "offset", headers, payload, effects
  FROM {history}
 WHERE (saga_type, saga_id) IN (SELECT * FROM unnest(%b::text[], %b::text[]))
   AND outcome IN ('applied', 'replayed')
 ORDER BY saga_type, saga_id, id
"""

LOAD_SAGA_DEADLINES = """
SELECT id::text, saga_type, saga_id, name, due_at, payload, dispatch_token
  FROM {deadline}
 WHERE (saga_type, saga_id) IN (SELECT * FROM unnest(%b::text[], %b::text[]))
"""

RELEASE_HELD = "DELETE FROM {parked} WHERE id = ANY(%s::bigint[])"

# An operator's fire-now: due at once and undispatched, so the leader fires it next.
FIRE_NOW = """
UPDATE {deadline} AS d SET due_at = now(), dispatched_at = NULL, dispatch_token = NULL
  FROM unnest(%b::text[], %b::text[], %b::text[]) AS u(t, i, n)
 WHERE d.saga_type = u.t AND d.saga_id = u.i AND d.name = u.n
"""

INSERT_PARKED = """
INSERT INTO {parked} (saga_type, saga_id, topic, partition, "offset", key, value,
                      headers, reason)
SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[], %b::bigint[],
                     %b::bytea[], %b::bytea[], %b::jsonb[], %b::text[])
"""

COMMIT_OFFSETS = """
UPDATE {offsets} AS o SET next_offset = u.n, updated_at = now()
  FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::bigint[], %b::bigint[])
       AS u(t, p, n, expected, epoch)
 WHERE o.group_id = %s AND o.topic = u.t AND o.partition = u.p
   AND o.owner_epoch = u.epoch AND o.next_offset IS NOT DISTINCT FROM u.expected
RETURNING o.topic, o.partition
"""

# Operator actions the batch decided (see migration 13), in decision order; one JSON array per
# entry, its target nested as it is.
INSERT_AUDIT = """
INSERT INTO {audit} (actor, action, reason, saga_type, saga_id, target, outcome)
SELECT x->>0, x->>1, x->>2, x->>3, x->>4, x->5, x->>6
  FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS u(x, n) ORDER BY n
"""
