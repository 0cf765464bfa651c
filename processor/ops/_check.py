"""The preflight check: can this code take over the live database and topics?

Run with the new code before it processes anything (a CI/CD step or a Kubernetes init job,
`saga-processor check`). Nothing is written. It reports, and fails on:

- a non-ended saga whose stored state does not load through the saga type's upcasters into
  the current class (or whose type no configured saga has);
- a state machine saga stored in a machine state the class no longer declares;
- a pending deadline whose name no handler of its saga takes;
- a parked (held) message that the code cannot decode or no handler of its saga takes;
- a topic the sagas read or write that does not exist, or whose partition count differs from
  the partitions the consumer group stored offsets for (keys would hash elsewhere);
- a schema that is not at the migration this code expects (one that was never migrated stops
  the check: :class:`processor._errors.SchemaNotMigrated`, before any other table is read).

On a Citus cluster it notes where the schema's tables are (which worker, or still on the
coordinator; with the tables distributed by bucket, how many buckets on each worker, and for each
input topic whether its partition count keeps every batch on one worker).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from processor._authoring.messages import MessageRegistry
from processor._authoring.upcasting import MissingUpcaster
from processor._engine.buckets import growth_verdict
from processor._engine.partitioner import Partitioner, fits, matching
from processor._engine.plan import describe_error
from processor._errors import SchemaNotMigrated
from processor._invocation import BoundSaga
from processor._ports.operator import CheckSource, StoredSaga
from processor._wire import DEADLINE_FIRED

__all__ = ["CheckReport", "Topology", "command_topics", "run_check"]

# At most this many example ids per problem: a report names the fault, not every instance.
_EXAMPLES = 3


@dataclass
class CheckReport:
    """What the check found.

    Attributes:
        problems: One line per problem; any problem fails the check.
        notes: Things an operator should know that do not fail it.
        counts: What was examined.
        schema_newer: The schema is at a later migration than this code (a rollback).
    """

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    # The schema is newer than this code (a rollback): a warning, not a problem.
    schema_newer: bool = False

    @property
    def ok(self) -> bool:
        """No problem was found."""
        return not self.problems

    def render(self) -> str:
        """The report as text: counts, problems, notes, verdict."""
        lines = ["checked: " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))]
        lines += [f"PROBLEM: {p}" for p in self.problems]
        lines += [f"note: {n}" for n in self.notes]
        lines.append(
            "check passed" if self.ok else f"check FAILED: {len(self.problems)} problem(s)"
        )
        return "\n".join(lines)


@dataclass(frozen=True)
class Topology:
    """The topics the check compares with the cluster.

    Attributes:
        group_id: The consumer group whose stored offsets are compared.
        read: Topics the processor consumes (prefix applied).
        written: Topics it produces to: command topics and the dead-letter topic.
        partition_counts: Reads the cluster: topic -> partition count, None if missing; None
            to skip the topic checks.
    """

    group_id: str
    read: frozenset[str]
    written: frozenset[str]
    partition_counts: Callable[[Iterable[str]], Mapping[str, int | None]] | None
    # Keys of recent records of a read topic with their partitions, and the partitioner they
    # must fit (SAGA_CONSUMER__PARTITIONER); None skips the key check.
    sample_keys: Callable[[str, int], list[tuple[bytes, int]]] | None = None
    partitioner: Partitioner = "crc32"


def command_topics(sagas: Iterable[BoundSaga], registry: MessageRegistry) -> set[str]:
    """The default topics of the registered message types the sagas' modules refer to.

    A command's topic is only known when a handler sends it, so the check takes the message
    classes named in each saga class's module (where its handlers find them), minus the events
    it handles; the prefix is not applied.
    """
    out: set[str] = set()
    for bound in sagas:
        module = sys.modules.get(bound.definition.state_cls.__module__)
        for value in vars(module).values() if module is not None else ():
            if (
                isinstance(value, type)
                and value in registry
                and value not in bound.definition.event_handlers
            ):
                topic = registry.of(value).topic
                if topic:
                    out.add(topic)
    return out


def run_check(
    source: CheckSource,
    sagas: Mapping[str, BoundSaga],
    registry: MessageRegistry,
    *,
    expected_schema: int,
    topology: Topology | None = None,
) -> CheckReport:
    """Runs every check and returns the report; never writes.

    Args:
        source: The live database's tables.
        sagas: The bound sagas of the new code.
        registry: The new code's message types.
        expected_schema: The migration number this code expects.
        topology: Topics to compare with the cluster; None skips the topic checks.

    Raises:
        SchemaNotMigrated: The schema holds none of the processor's tables (no migration ran):
            nothing else is read.
    """
    report = CheckReport()
    found = source.schema_version()
    if found == 0:
        raise SchemaNotMigrated(f"no migration ran, this code expects {expected_schema}")
    _schema(report, found, expected_schema)
    where = source.distribution()
    if where is not None:
        report.notes.append(where)
    wrong_node = source.node_problem()
    if wrong_node is not None:
        report.problems.append(wrong_node)
    buckets = source.buckets()
    if buckets is not None and topology is not None and topology.partition_counts is not None:
        read = sorted(topology.read)
        for topic, count in sorted(topology.partition_counts(read).items()):
            if count is not None:
                report.notes.append(f"topic {topic!r}: {growth_verdict(count, buckets)}")
    _states(report, source.unended_sagas(), sagas)
    _deadlines(report, source.pending_deadlines(), sagas)
    _parked(report, source.parked_messages(), sagas, registry)
    if topology is not None:
        _topics(report, topology, source.stored_partitions(topology.group_id))
    return report


def _schema(report: CheckReport, found: int, expected: int) -> None:
    report.counts["schema version"] = found
    if found < expected:
        report.problems.append(
            f"schema is at migration {found}, this code expects {expected}: run "
            "`saga-processor migrate` first (review it with `saga-processor migrate --sql`)"
        )
    elif found > expected:
        # Migrations only add (tables, columns with defaults, indexes), so the previous release
        # runs on the newer schema: a rollback must not be blocked by its pre-upgrade check.
        report.schema_newer = True
        report.notes.append(
            f"WARNING: schema is at migration {found}, newer than this code's {expected}: this "
            "code is older than the schema (a rollback past a migration); it runs on it, and "
            "`migrate` leaves it as it is"
        )


def _states(
    report: CheckReport, rows: Iterable[StoredSaga], sagas: Mapping[str, BoundSaga]
) -> None:
    # (saga type, stored version, reason) -> ids, so 200 sagas with one cause make one line.
    failures: dict[tuple[str, int, str], list[str]] = {}
    versions: Counter[tuple[str, int]] = Counter()
    machine_states: dict[str, frozenset[str] | None] = {}
    for row in rows:
        report.counts["unended sagas"] += 1
        bound = sagas.get(row.saga_type)
        if bound is None:
            failures.setdefault(
                (row.saga_type, row.state_version, "no saga class of this type is configured"), []
            ).append(row.saga_id)
            continue
        versions[(row.saga_type, row.state_version)] += 1
        if row.state is not None:
            try:
                bound.state_from_json(row.state, row.state_version)
            except MissingUpcaster as e:
                failures.setdefault((row.saga_type, row.state_version, str(e)), []).append(
                    row.saga_id
                )
                continue
            except Exception as e:  # the saga's own model or upcaster raised
                reason = f"does not load into v{bound.state_version}: {describe_error(e)}"
                failures.setdefault((row.saga_type, row.state_version, reason), []).append(
                    row.saga_id
                )
                continue
        if row.machine_state is not None:
            if row.saga_type not in machine_states:
                machine_states[row.saga_type] = _machine_states(bound)
            known = machine_states[row.saga_type]
            if known is not None and row.machine_state not in known:
                reason = f"machine state {row.machine_state} is not declared by the class"
                failures.setdefault((row.saga_type, row.state_version, reason), []).append(
                    row.saga_id
                )
    for (saga_type, version, reason), ids in sorted(failures.items()):
        report.problems.append(
            f"saga {saga_type!r} state v{version}: {len(ids)} unended saga(s) cannot run: "
            f"{reason} (e.g. {', '.join(ids[:_EXAMPLES])})"
        )
    for (saga_type, version), n in sorted(versions.items()):
        current = sagas[saga_type].state_version
        if version != current:
            report.notes.append(
                f"saga {saga_type!r}: {n} saga(s) stored at state v{version} are upcast to "
                f"v{current} on their next change"
            )


def _machine_states(bound: BoundSaga) -> frozenset[str] | None:
    spec = getattr(bound.definition.state_cls, "machine_spec", None)
    if not callable(spec):
        return None
    return frozenset(str(s) for s in spec().transitions.states)


def _deadlines(
    report: CheckReport, rows: list[tuple[str, str, int]], sagas: Mapping[str, BoundSaga]
) -> None:
    for saga_type, name, n in rows:
        report.counts["pending deadlines"] += n
        bound = sagas.get(saga_type)
        if bound is None:
            report.problems.append(
                f"{n} deadline(s) {name!r} of saga type {saga_type!r}, which no configured saga has"
            )
        elif name not in bound.definition.deadline_handlers:
            report.problems.append(
                f"saga {saga_type!r}: {n} pending deadline(s) {name!r} and no "
                f"@saga_deadline_handler({name!r}); they would park their sagas when they fire"
            )


def _parked(
    report: CheckReport,
    rows: list[tuple[str, str | None, str | None, int]],
    sagas: Mapping[str, BoundSaga],
    registry: MessageRegistry,
) -> None:
    for saga_type, name, version_text, n in rows:
        report.counts["held messages"] += n
        bound = sagas.get(saga_type)
        if bound is None:
            report.problems.append(
                f"{n} message(s) held behind sagas of type {saga_type!r}, which no configured "
                "saga has"
            )
            continue
        if name == DEADLINE_FIRED:
            continue  # a fired deadline's name is checked with the pending deadlines
        what = f"{name!r} v{version_text}"
        version = int(version_text) if version_text and version_text.isdigit() else None
        entry = None
        if name is not None and name in registry:
            if version is None:
                entry = registry.by_name(name)
            elif (name, version) in {(e.name, e.version) for e in registry.all()}:
                entry = registry.by_name(name, version)
            else:
                path = registry.upcast_path(name, version)
                entry = path[0] if path is not None else None
        if entry is None:
            report.problems.append(
                f"saga {saga_type!r}: {n} held message(s) {what} that this code cannot decode"
            )
        elif entry.cls not in bound.definition.event_handlers:
            report.problems.append(
                f"saga {saga_type!r}: {n} held message(s) {what} and no handler for "
                f"{entry.cls.__qualname__}"
            )
        else:
            report.notes.append(
                f"saga {saga_type!r}: {n} held message(s) {what} decode with this code; "
                "`saga-processor retry` replays them once it runs"
            )


def _topics(report: CheckReport, topology: Topology, stored: Mapping[str, set[int]]) -> None:
    if topology.partition_counts is None:
        return
    topics = sorted(topology.read | topology.written)
    counts = topology.partition_counts(topics)
    for topic in topics:
        report.counts["topics"] += 1
        count = counts.get(topic)
        role = "reads" if topic in topology.read else "writes"
        if count is None:
            report.problems.append(f"topic {topic!r} (the processor {role} it) does not exist")
            continue
        if topic in topology.read and topology.sample_keys is not None:
            _placement(report, topology, topic, count, stored.get(topic))
        partitions = stored.get(topic)
        if topic in topology.read and partitions and partitions != set(range(count)):
            known = max(partitions) + 1
            if partitions <= set(range(count)) and count > known and count % known == 0:
                # Grown online to a multiple: the replicas take the new partitions, each one's
                # records after the old partition's (processor/_engine/growth.py).
                report.notes.append(
                    f"topic {topic!r} grew from {known} to {count} partitions; the replicas "
                    "take the new ones, each record after what was sent to the old ones first"
                )
                continue
            report.problems.append(
                f"topic {topic!r} has {count} partition(s) but the group "
                f"{topology.group_id!r} stored offsets for {len(partitions)} "
                f"(0..{max(partitions)}): the partition count changed, so saga ids now hash "
                "to other partitions than their history and deadlines"
            )


def _placement(
    report: CheckReport, topology: Topology, topic: str, count: int, stored: set[int] | None
) -> None:
    """Whether recent records' keys are where the configured partitioner puts them."""
    assert topology.sample_keys is not None
    sample = topology.sample_keys(topic, count)
    report.counts["sampled keys"] += len(sample)
    if not sample:
        return
    # Mid-growth, producers that have not refreshed still hash with the count the group knew.
    counts = (count,) if not stored or max(stored) + 1 >= count else (count, max(stored) + 1)
    off = [(k, p) for k, p in sample if not fits(k, p, counts, topology.partitioner)]
    if not off:
        return
    would = matching(sample, counts)
    hint = (
        f"every sampled key fits {' and '.join(would)}: set SAGA_CONSUMER__PARTITIONER="
        f"{would[0]}, or the producers' partitioner to match {topology.partitioner}"
        if would
        else "no known partitioner fits them all (producers pick partitions themselves, or "
        "use several partitioners)"
    )
    report.problems.append(
        f"topic {topic!r}: {len(off)} of {len(sample)} sampled record keys are not on the "
        f"partition SAGA_CONSUMER__PARTITIONER={topology.partitioner} puts them on; {hint}. "
        "Deadlines and operator records of those sagas would go to another partition than "
        "their events"
    )
