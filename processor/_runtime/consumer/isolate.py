"""Finds the records of a batch that the database refuses, so the rest can commit.

The planner and the decoder judge every record they can, but a database may still refuse one
(a constraint, a limit, a value its types cannot hold). Retrying the batch would fail the same
way forever and stall the partition, so the refused records are found by trial writes that are
rolled back, and the rest of the batch commits.

A saga's records depend on each other (each is planned on the state the earlier ones left), but
records of different sagas do not, so the search halves the batch's sagas: a half that writes
is cleared at once, a half that is refused is halved again, down to one saga. That saga is
parked at its first record of the batch, with the database's reason, and its records are held
behind it in order, as for any other failure of one saga, for an operator to retry once the
cause is fixed. Only when even the parked saga cannot be written (the record's own bytes are
what the database refuses) are its records dead-lettered, the first refused one found by
bisection over the prefixes of the saga's records. With b refused sagas among n records this
costs at most about b x 2 (log2(n / b) + 1) trial writes, most of them small, instead of about
b x log2(n) writes of up to the whole batch each. Records refused only in combination (two
sagas' rows that clash) are found by the plain bisection over prefixes of the whole batch,
which assumes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from processor._engine.decode import Decoded, Reason, Rejected
from processor._engine.records import Record
from processor._engine.rows import SagaKey, WriteSet
from processor._errors import RecordDataError

log = logging.getLogger(__name__)

Attempt = Callable[[list[Decoded], bool, Mapping[SagaKey, str]], WriteSet]
"""Plans and writes the given records, parking the sagas named (with their reasons) instead of
running their handlers; ``True`` rolls back instead of committing."""

SagasOf = Callable[[list[Decoded]], set[SagaKey]]
"""The sagas the given records are routed to."""

# How often a long search says how far it is.
PROGRESS_EVERY = 5.0


def isolate_refused(
    decoded: list[Decoded],
    attempt: Attempt,
    between: Callable[[], None] | None = None,
    sagas_of: SagasOf | None = None,
) -> WriteSet:
    """Commits ``decoded``, parking each saga whose writes the database refuses.

    Args:
        decoded: The batch's records, in order.
        attempt: Plans and writes records (rolled back when its flag is True).
        between: Called before each trial write: the consumer keeps polling meanwhile.
        sagas_of: The sagas records are routed to; without it, refused records are
            dead-lettered rather than their sagas parked.

    Returns the write set that committed. Any failure other than refused data is raised to the
    caller, which resyncs; nothing is committed then.
    """
    # The batch as a whole was refused already: the search starts at its halves.
    search = _Search(list(decoded), attempt, between, sagas_of)
    search.by_sagas()
    for _ in range(len(search.records) + 1):
        try:
            ws = search.attempt(search.records, False, search.park)
        except RecordDataError as refused:
            # Refused only together with records of other sagas: no saga alone is refused.
            search.dead_letter(*search.first_refused(range(len(search.records)), refused))
            continue
        log.warning(
            "batch of %d records: the database refused the writes of %d saga(s), parked, and "
            "%d record(s), dead-lettered; found in %d trial writes (%.1f s)",
            len(search.records),
            len(search.park),
            search.found,
            search.trials,
            time.monotonic() - search.started,
        )
        return ws
    raise RecordDataError(None, "the database refuses every record of the batch")


class _Search:
    """The batch as it stands (refused records replaced by their dead letters) and its trials."""

    def __init__(
        self,
        records: list[Decoded],
        attempt: Attempt,
        between: Callable[[], None] | None,
        sagas_of: SagasOf | None,
    ) -> None:
        self.records = records
        self._attempt = attempt
        self._between = between
        self._sagas_of = sagas_of
        # Sagas to park, with the database's reason, instead of running their handlers.
        self.park: dict[SagaKey, str] = {}
        self.trials = 0
        self.found = 0
        self.started = self._said = time.monotonic()

    def attempt(
        self, records: list[Decoded], dry_run: bool, park: Mapping[SagaKey, str]
    ) -> WriteSet:
        if self._between is not None:
            self._between()
        self.trials += 1
        now = time.monotonic()
        if now - self._said >= PROGRESS_EVERY:
            self._said = now
            log.warning(
                "isolating refused records of a batch of %d: %d found in %d trial writes so far",
                len(self.records),
                self.found + len(self.park),
                self.trials,
            )
        return self._attempt(records, dry_run, park)

    def refused(self, indexes: list[int]) -> RecordDataError | None:
        """The database's refusal of these records alone, written and rolled back; or None."""
        try:
            self.attempt([self.records[i] for i in indexes], True, self.park)
        except RecordDataError as e:
            return e
        return None

    def by_sagas(self) -> None:
        groups: dict[tuple[str, int, bytes | None], list[int]] = {}
        for i, d in enumerate(self.records):
            r = d.record
            groups.setdefault((r.topic, r.partition, r.key), []).append(i)
        self._halve(list(groups.values()), None)

    def _halve(self, groups: list[list[int]], refused: RecordDataError | None) -> None:
        """Finds the refused records of ``groups``, known (or, with None, presumed) refused."""
        if len(groups) == 1:
            self._within(groups[0], refused)
            return
        half = len(groups) // 2
        left, right = groups[:half], groups[half:]
        left_refused = self.refused([i for g in left for i in g])
        if left_refused is None:
            # The whole was refused and this half was not: the other half is, unless only the
            # two together are (the final write finds that case).
            self._halve(right, None)
            return
        self._halve(left, left_refused)
        right_refused = self.refused([i for g in right for i in g])
        if right_refused is not None:
            self._halve(right, right_refused)

    def _within(self, saga: list[int], refused: RecordDataError | None) -> None:
        """Parks the sagas of one key whose writes the database refuses.

        If it refuses even the parked sagas' rows, dead-letters the refused records instead,
        first to last.
        """
        for tries in range(2 * len(saga) + 1):
            if refused is None:
                refused = self.refused(saga)
                if refused is None:
                    return
            if tries == 0 and self._park(saga, refused):
                return
            self.dead_letter(*self.first_refused(saga, refused))
            refused = None

    def _park(self, saga: list[int], refused: RecordDataError) -> bool:
        if self._sagas_of is None:
            return False
        keys = self._sagas_of([self.records[i] for i in saga]) - self.park.keys()
        if not keys:
            return False
        # The server's primary message names the constraint or limit, never a row's values.
        reason = f"the database refused its writes ({refused.sqlstate}: {refused.reason})"[:1000]
        self.park.update(dict.fromkeys(keys, reason))
        if self.refused(saga) is None:
            for saga_type, saga_id in sorted(keys):
                log.warning("saga %s %s parked: %s", saga_type, saga_id, reason)
            return True
        for key in keys:  # the parked saga's own rows are refused too: its records must go
            del self.park[key]
        return False

    def first_refused(
        self, indexes: range | list[int], refused: RecordDataError
    ) -> tuple[int, RecordDataError]:
        """The first of ``indexes`` whose prefix is refused, and that prefix's refusal.

        ``refused`` is the refusal of all of ``indexes`` together.
        """
        low, high = 1, len(indexes)
        while low < high:
            middle = (low + high) // 2
            error = self.refused(list(indexes[:middle]))
            if error is None:
                low = middle + 1
            else:
                high, refused = middle, error
        return indexes[low - 1], refused

    def dead_letter(self, index: int, refused: RecordDataError) -> None:
        self.found += 1
        self.records[index] = _dead_letter(self.records[index], refused)


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
