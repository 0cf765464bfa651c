"""The deploy-time subcommands: `migrate`, the preflight `check`, and `citus-node`.

`migrate` (or its DDL with `--sql`) and `check` run before new code processes anything: as a
CI/CD step, or the Kubernetes Job that the deploy manifests run ahead of the rollout
(deploy/kubernetes). `citus-node` shows the Citus node a schema's processes connect through, and
moves them to another with every process stopped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from processor._cli.commands import adapters, emit, json_flag, operator_name
from processor.ops._check import CheckReport
from processor.settings import ProcessorSettings

if TYPE_CHECKING:
    from processor._runtime.assembly import BoundSagas


def migrate_arguments(parser: argparse.ArgumentParser) -> None:
    """`--sql` prints the pending DDL instead of applying it; `--json`."""
    parser.add_argument(
        "--sql", action="store_true", help="print the DDL that would run, change nothing"
    )
    json_flag(parser)


def migrate(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Creates or upgrades the schema and prints its version; exit code 0.

    With `--sql`, prints the statements a migration would run on the live schema and changes
    nothing, so a reviewer (or a DBA who applies DDL by hand) sees them first.
    """
    made = adapters(settings)
    tables = made.tables
    if getattr(args, "sql", False):
        current, ddl = made.pending_migrations()
        target = made.schema_version
        where = f"schema {settings.database.schema_name} is at migration {current}"
        if args.json:
            plan = {"schema": tables.schema, "current": current, "target": target, "sql": ddl}
            emit(args, plan, "")
        elif not ddl:
            print(f"-- {where}; nothing to apply")
        else:
            sys.stdout.write(f"-- {where}; this brings it to {target}\n\n{ddl}")
        return 0
    version = made.migrate()
    done = {"schema": tables.schema, "version": version}
    emit(args, done, f"schema {settings.database.schema_name} at version {version}")
    return 0


def citus_node_arguments(parser: argparse.ArgumentParser) -> None:
    """`show` (the default) or `move`; `--json`."""
    parser.add_argument(
        "action",
        nargs="?",
        choices=["show", "move"],
        default="show",
        help="show: the node the database URL reaches and the one the schema's processes use; "
        "move: make the node the URL reaches theirs (stop every process of the schema first)",
    )
    parser.add_argument("--reason", default=None, help="with move: why, for the operators' trail")
    json_flag(parser)


def citus_node(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Shows or moves the Citus node the schema's processes connect through; exit code 0.

    `move` is refused (exit code 2) where it would break the order of the schema's rows; see
    :func:`processor._postgres.schema.citus_move.move_pin`.
    """
    made = adapters(settings)
    schema = made.tables.schema
    if args.action == "move":
        moved = made.move_citus_node(operator_name(settings), args.reason)
        came = moved.before.node if moved.before else "no node"
        raised = ", ".join(f"{t} to {n}" for t, n in moved.raised.items()) or "none"
        emit(
            args,
            {
                "schema": schema,
                "before": moved.before,
                "after": moved.after,
                "raised": moved.raised,
            },
            f"schema {schema}: its processes now connect through {moved.after.node} (group "
            f"{moved.after.group_id}), before {came}; sequences raised: {raised}",
        )
        return 0
    here, pinned = made.citus_node()
    if here is None:
        emit(args, {"schema": schema, "here": None, "pinned": None}, "not a Citus database")
        return 0
    where = (
        f"its processes connect through {pinned.node} (group {pinned.group_id}), first "
        f"{pinned.pinned_by} at {pinned.pinned_at.isoformat(sep=' ', timespec='seconds')}"
        if pinned
        else "no process has connected yet"
    )
    emit(
        args,
        {"schema": schema, "here": {"group": here[0], "node": here[1]}, "pinned": pinned},
        f"schema {schema}: {where}; this URL reaches {here[1]} (group {here[0]})",
    )
    return 0


# -- preflight ---------------------------------------------------------------------------------


def check_arguments(parser: argparse.ArgumentParser) -> None:
    """`--skip-topics` leaves Kafka out (database checks only); `--json`."""
    parser.add_argument(
        "--skip-topics", action="store_true", help="do not compare topics with the cluster"
    )
    json_flag(parser)


def check(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Prints the preflight report; exit code 0 when it passed, 1 when it found problems.

    A saga configuration that does not bind (e.g. a gap in a chain of upcasters) fails
    earlier, with exit code 2, like every refused configuration.
    """
    from processor._cli.commands import app_of
    from processor._runtime.assembly import open_sagas

    # The app's sagas and dependencies, as `run` would have them (else SAGA_SAGAS).
    with open_sagas(settings, app_of(args)) as (saga_classes, dependencies):
        report = check_from_settings(
            settings, saga_classes, dependencies=dependencies, topics=not args.skip_topics
        )
    found = {
        "ok": report.ok,
        "problems": report.problems,
        "notes": report.notes,
        "counts": dict(report.counts),
        "schema_newer": report.schema_newer,
    }
    emit(args, found, report.render())
    return 0 if report.ok else 1


def check_from_settings(
    settings: ProcessorSettings,
    saga_classes: Iterable[type[Any]] | None = None,
    *,
    dependencies: Mapping[type, object] | None = None,
    topics: bool = True,
) -> CheckReport:
    """Runs the preflight check with the sagas `settings.sagas` names (or ``saga_classes``).

    Reads the live database (and the cluster's topic metadata unless ``topics`` is false);
    writes nothing.
    """
    from processor._runtime.assembly import bind_sagas
    from processor._wire import DEADLINE_FIRED, OPERATOR_COMMAND
    from processor.ops._check import Topology, run_check

    # Records this project placed itself: fired deadlines and operator commands.
    OURS = frozenset({DEADLINE_FIRED, OPERATOR_COMMAND})

    bound = bind_sagas(settings, saga_classes, dependencies=dependencies)
    read, written = topic_names(settings, bound)
    made = adapters(settings)
    topology = Topology(
        group_id=settings.consumer.group_id,
        read=frozenset(read),
        written=frozenset(written),
        partition_counts=made.partition_counts if topics else None,
        sample_keys=((lambda t, n: made.sample_keys(t, n, OURS)) if topics else None),
        partitioner=settings.consumer.partitioner,
    )
    with made.check_source() as source:
        report = run_check(
            source,
            bound.sagas,
            bound.registry,
            expected_schema=made.schema_version,
            topology=topology,
        )
    _check_registry(settings, bound, report)
    return report


def _check_registry(settings: ProcessorSettings, bound: BoundSagas, report: CheckReport) -> None:
    """Adds a problem per model schema the registry would refuse (framed topics only)."""
    from processor._bootstrap.schemas import registry_client
    from processor._errors import Retryable
    from processor._schemas.plan import plan_schemas
    from processor.ops._schemas import check_schemas

    sr = settings.schema_registry
    formats = sr.formats(settings.topic_prefix)
    if not formats:
        return
    plans = plan_schemas(bound.registry, formats, sr.subject_naming, settings.topic_prefix)
    client = registry_client(sr)
    try:
        verdicts = check_schemas(client, plans)
    except Retryable as e:
        report.problems.append(f"the schema registry did not answer: {e}")
        return
    finally:
        client.close()
    report.counts["registry schemas"] = len(verdicts)
    for v in verdicts:
        if not v.ok:
            where = v.plan.writer.subject if v.plan.writer else v.plan.topic
            report.problems.append(
                f"schema of {v.plan.mtype.name} v{v.plan.mtype.version} under {where}: "
                f"{v.outcome} ({v.detail})"
            )


def topic_names(settings: ProcessorSettings, bound: BoundSagas) -> tuple[set[str], set[str]]:
    """The topics the bound sagas read, and those they only write (prefix applied).

    Read: ``SAGA_CONSUMER__TOPICS``, else the topics of the events the sagas handle. Written:
    the topics of the commands their modules refer to, and the dead-letter topic.
    """
    from processor._wire import Topics
    from processor.ops._check import command_topics

    names = Topics(settings.topic_prefix)
    if settings.consumer.topics:
        read = {names.name(t) for t in settings.consumer.topics}
    else:
        read = {
            names.name(t) for c in bound.planner.event_types if (t := bound.registry.of(c).topic)
        }
    written = {names.name(t) for t in command_topics(bound.sagas.values(), bound.registry)}
    written.add(names.name(settings.consumer.dead_letter_topic))
    return read, written - read
