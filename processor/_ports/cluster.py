"""What the cluster looks like to the operator and the probes.

Replicas, partitions and owners, the deadline lease, the relay's backlog, the topics, and one
sample of the database.

Pure shapes filled by the adapters (``processor._postgres.reads.cluster``,
``processor._postgres.reads.gauges``, ``processor._kafka.admin``) and read by the console, the CLI
and the metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from processor._ports.views import ConsumerLag

TP = tuple[str, int]


AGE_BUCKETS = (60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0, 259200.0, 604800.0)
"""Upper bounds, in seconds, of the buckets of ``saga_state_age_seconds``: 1 min to 7 days."""


@dataclass(frozen=True, slots=True)
class DatabaseSample:
    """One reading of the processor's tables.

    Attributes:
        outbox_depth: Rows waiting in the outbox.
        outbox_oldest_age: Seconds since the oldest outbox row was written; 0 when empty.
        deadlines_pending: Deadlines scheduled and not dispatched.
        deadlines_overdue: Deadlines due and not dispatched.
        instances: Saga instances by (saga type, status).
        machine_states: Sagas not ended by (saga type, machine state): (count, oldest age).
        state_ages: For the same keys, how many have been in that state at most each of
            :data:`AGE_BUCKETS` (cumulative), and the sum of their ages in seconds.
        stored_offsets: Next offset stored for each partition this replica owns.
        schema_version: The schema version the database is migrated to.
    """

    outbox_depth: int = 0
    outbox_oldest_age: float = 0.0
    deadlines_pending: int = 0
    deadlines_overdue: int = 0
    instances: dict[tuple[str, str], int] = field(default_factory=dict)
    machine_states: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    state_ages: dict[tuple[str, str], tuple[tuple[int, ...], float]] = field(default_factory=dict)
    stored_offsets: dict[TP, int | None] = field(default_factory=dict)
    schema_version: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class RelayBacklog:
    """Outbox rows waiting for the relay, from one input partition or from none.

    Attributes:
        pending: Rows not published yet (at most the view's cap).
        oldest: How long the oldest of them has waited; None when there are none.
        failed: Rows the relay set aside (`failed_outbox`), at most the view's cap.
    """

    pending: int
    oldest: timedelta | None
    failed: int


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionRow:
    """One input partition of the consumer group.

    Attributes:
        topic: The input topic.
        partition: The partition.
        owner: The instance id of the replica that claimed it last.
        epoch: Its ownership epoch: each claim bumps it, and fences older owners' commits.
        stored: The next offset to read, stored with the effects (None: nothing consumed yet).
        updated_at: The last claim or commit.
        relay: The outbox rows its records caused, waiting for its owner's relay.
        high: The broker's high watermark; None when the broker did not answer.
        lag: Records not consumed yet; None when the broker did not answer.
    """

    topic: str
    partition: int
    owner: str | None
    epoch: int
    stored: int | None
    updated_at: datetime
    relay: RelayBacklog
    high: int | None = None
    lag: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DeadlineLease:
    """The deadline poller's lease: one replica fires due deadlines at a time.

    Attributes:
        holder: The instance id that holds (or last held) it.
        token: Its fencing token; a fired record carries it, and a stale one is ignored.
        expires_at: When it lapses unless renewed (database time).
        remaining: Time left; negative once it has lapsed.
    """

    holder: str
    token: int
    expires_at: datetime
    remaining: timedelta

    @property
    def held(self) -> bool:
        """Whether the lease is still current."""
        return self.remaining > timedelta(0)


@dataclasses.dataclass(frozen=True, slots=True)
class Replica:
    """A processor replica, as an owner of partitions or a database session.

    Attributes:
        instance_id: Its instance id (`SAGA_INSTANCE_ID`, else host, pid and a random suffix).
        partitions: How many of the group's partitions it owns.
        last_write: Its partitions' latest claim or commit; None when it owns none.
        connections: Its database sessions now (0: not connected, so probably gone).
        holds_lease: Whether it holds the deadline poller's lease now.
    """

    instance_id: str
    partitions: int
    last_write: datetime | None
    connections: int
    holds_lease: bool


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterView:
    """The cluster page.

    Attributes:
        group_id: The consumer group.
        replicas: Owners of partitions first, then other connected replicas.
        partitions: The group's partitions in topic and partition order.
        lease: The deadline poller's lease; None before any replica took it.
        unpartitioned: Outbox rows of no input partition (written before partitioned relays,
            or by no input), which one relay at a time publishes.
        cap: The most rows a count reads; a count at the cap means at least that many.
        lag: The group's total lag; None when the broker did not answer.
    """

    group_id: str
    replicas: list[Replica]
    partitions: list[PartitionRow]
    lease: DeadlineLease | None
    unpartitioned: RelayBacklog
    cap: int
    lag: int | None = None


@dataclass(frozen=True)
class TopicPlan:
    """One topic as the processor wants it."""

    name: str
    role: str  # "reads" or "writes"
    partitions: int
    replication_factor: int
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TopicFound:
    """One topic as the cluster has it."""

    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)


def replicas_of(
    partitions: list[PartitionRow],
    connected: Mapping[str, int],
    lease: DeadlineLease | None,
) -> list[Replica]:
    """The replicas seen as owners, then those only connected, each in instance id order.

    Args:
        partitions: The group's partitions with their owners.
        connected: Database sessions per instance id, from ``pg_stat_activity``.
        lease: The deadline lease, to mark its current holder.
    """
    owned: dict[str, list[PartitionRow]] = {}
    for p in partitions:
        if p.owner is not None:
            owned.setdefault(p.owner, []).append(p)
    holder = lease.holder if lease is not None and lease.held else None
    out = [
        Replica(
            owner,
            len(rows),
            max(r.updated_at for r in rows),
            connected.get(owner, 0),
            owner == holder,
        )
        for owner, rows in sorted(owned.items())
    ]
    out += [
        Replica(name, 0, None, n, name == holder)
        for name, n in sorted(connected.items())
        if name not in owned
    ]
    return out


def with_lag(view: ClusterView, lag: ConsumerLag | None) -> ClusterView:
    """``view`` with each partition's high watermark and lag, when the broker answered."""
    if lag is None:
        return view
    marks = {(p.topic, p.partition): p for p in lag.partitions}
    partitions = [
        dataclasses.replace(p, high=m.high, lag=m.lag)
        if (m := marks.get((p.topic, p.partition))) is not None
        else p
        for p in view.partitions
    ]
    return dataclasses.replace(view, partitions=partitions, lag=lag.total)
