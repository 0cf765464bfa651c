"""Finds the records of a batch that the database refuses, so the rest can commit.

The planner and the decoder judge every record they can, but a database may still refuse one
(a constraint, a limit, a value its types cannot hold). Retrying the batch would fail the same
way forever and stall the partition, so the refused record is found by bisection over prefixes
of the batch, written in transactions that are rolled back, then dead-lettered with the
database's reason while every other record commits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from processor.engine.decode import Decoded, Reason, Rejected
from processor.engine.records import Record
from processor.engine.rows import WriteSet
from processor.errors import RecordDataError

log = logging.getLogger(__name__)

Attempt = Callable[[list[Decoded], bool], WriteSet]
"""Plans and writes the given records; ``True`` rolls back instead of committing."""


def isolate_refused(decoded: list[Decoded], attempt: Attempt) -> WriteSet:
    """Commits ``decoded``, dead-lettering each record the database refuses.

    Returns the write set that committed. Any failure other than refused data is raised to the
    caller, which resyncs; nothing is committed then.
    """
    records = list(decoded)
    for _ in range(len(records) + 1):
        try:
            return attempt(records, False)
        except RecordDataError as refused:
            index = _first_refused(records, attempt)
            records[index] = _dead_letter(records[index], refused)
    raise RecordDataError(None, "the database refuses every record of the batch")


def _first_refused(records: list[Decoded], attempt: Attempt) -> int:
    """The position of the first record whose prefix the database refuses."""
    low, high = 1, len(records)  # the whole batch is known to be refused
    while low < high:
        middle = (low + high) // 2
        try:
            attempt(records[:middle], True)
            low = middle + 1
        except RecordDataError:
            high = middle
    return low - 1


def _dead_letter(d: Decoded, refused: RecordDataError) -> Rejected:
    record = d.record
    reason = f"{refused.sqlstate}: {refused.reason}"
    log.warning(
        "record %s[%d]@%d refused by the database (%s): dead-lettered",
        record.topic,
        record.partition,
        record.offset,
        reason,
    )
    if isinstance(d, Rejected):
        # Its dead letter itself cannot be stored (e.g. text the database cannot hold): keep
        # only where it is. The record stays in Kafka at that offset.
        bare = Record(record.topic, record.partition, record.offset, None, None, ())
        return Rejected(bare, Reason.REFUSED_BY_DATABASE, reason)
    return Rejected(record, Reason.REFUSED_BY_DATABASE, reason)
