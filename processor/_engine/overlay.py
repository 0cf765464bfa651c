"""Planning on top of a batch that is still committing."""

from __future__ import annotations

import uuid

from processor._engine.rows import DECIDED, Loaded, Outcome, SagaRow, WriteSet


def overlay(loaded: Loaded, prior: WriteSet) -> Loaded:
    """What ``loaded`` will be once ``prior`` commits.

    This lets a batch be planned while the one before it is still committing.

    Rows the prior batch writes replace the stored ones (so versions chain), the messages it
    applied count as applied (and the operator records it decided, as decided), and deadlines
    it deletes (consumed, cancelled, rescheduled, or cleared by an end) are gone. If the prior
    batch does not commit, the caller discards what it planned on top of it.

    The prior batch may in fact have committed already, so every step must also hold when
    `loaded` reflects it: in particular a deadline row the prior batch inserted stays, even
    though the same batch deleted that name first (a schedule is delete-then-insert).
    """
    sagas = dict(loaded.sagas)
    for s in prior.sagas:
        sagas[(s.saga_type, s.saga_id)] = SagaRow(
            s.saga_type, s.saga_id, s.state, s.status, s.version, s.parked_reason, s.state_version
        )
    applied = set(loaded.applied)
    applied.update(
        (h.saga_type, h.saga_id, h.message_id)
        for h in prior.history
        if h.outcome == Outcome.APPLIED
    )
    decided = loaded.decided
    if prior.audit:
        # Only a batch that decided an operator record audited one: events skip this pass.
        decided = set(decided)
        decided.update(
            (h.saga_type, h.saga_id, h.message_id)
            for h in prior.history
            if h.kind == "operator" and h.outcome in DECIDED
        )
    deleted = set(prior.deadline_deletes)
    cleared = set(prior.deadline_clears)
    inserted = {uuid.UUID(d.id) for d in prior.deadline_inserts}
    deadlines = {
        did: ref
        for did, ref in loaded.deadlines.items()
        if uuid.UUID(did) in inserted
        or (
            (ref.saga_type, ref.saga_id, ref.name) not in deleted
            and (ref.saga_type, ref.saga_id) not in cleared
        )
    }
    # Held records stay as loaded: a batch that replays them is never planned on top of
    # another (see Worker.poll_once), so the records a prior batch holds are never missing here.
    return Loaded(
        sagas,
        applied,
        deadlines,
        loaded.lease_token,
        loaded.now,
        tombstones=loaded.tombstones,
        held=loaded.held,
        decided=decided,
    )
