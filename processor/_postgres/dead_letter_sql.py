"""The statements behind `dead-letters list|show|purge` and the wait for an operator request.

Rendered by :class:`processor._postgres.reads.inspect.InspectQueries` (``{dead_letter}`` and
``{audit}`` are its tables' slots).
"""

from __future__ import annotations

from processor._wire import HEADER_MESSAGE_ID, HEADER_MESSAGE_TYPE

__all__ = ["DEAD_LETTER", "DEAD_LETTERS", "DEAD_LETTER_OF", "PURGE"]

_DL_COLUMNS = f"""
    id, topic, partition, "offset", reason, detail, headers->>'{HEADER_MESSAGE_ID}',
    headers->>'{HEADER_MESSAGE_TYPE}', created_at
"""
DEAD_LETTERS = f"""
    SELECT {_DL_COLUMNS} FROM {{dead_letter}}
     WHERE (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
       AND (%(reason)s::text IS NULL OR reason = %(reason)s::text)
     ORDER BY id DESC LIMIT %(limit)s
"""
DEAD_LETTER = f"SELECT {_DL_COLUMNS}, key, value, headers FROM {{dead_letter}} WHERE id = %s"
# A message id is in no index of the table: the rows written lately are found by the
# created_at index, and only those are read for the id.
DEAD_LETTER_OF = f"""
    SELECT {_DL_COLUMNS} FROM {{dead_letter}}
     WHERE created_at >= now() - %(within)s::interval
       AND headers->>'{HEADER_MESSAGE_ID}' = %(message_id)s
     ORDER BY id LIMIT 1
"""
# One statement, so the rows go and their audit entry is written together: the entry (when
# one is given and any row went) carries the count and the first ids, as
# `AuditEntry.touching` makes them.
PURGE = """
    WITH gone AS (
        DELETE FROM {dead_letter}
         WHERE (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
           AND (%(older)s::interval IS NULL OR created_at <= now() - %(older)s::interval)
        RETURNING id
    ), counted AS (
        SELECT count(*) AS n, (array_agg(id ORDER BY id))[1:%(cap)s] AS ids FROM gone
    ), audited AS (
        INSERT INTO {audit} (actor, action, reason, saga_type, saga_id, target, outcome)
        SELECT e->>0, e->>1, e->>2, e->>3, e->>4,
               (e->5) || jsonb_build_object('count', c.n, 'ids', to_jsonb(c.ids)), e->>6
          FROM counted AS c, jsonb_array_elements(%(audit)s::jsonb) AS e
         WHERE c.n > 0
    )
    SELECT n FROM counted
"""
