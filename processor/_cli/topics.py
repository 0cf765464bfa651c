"""`saga-processor topics plan|create|check`: the topics the sagas need, made and checked.

`plan` prints every topic the processor reads or writes with the partitions, replicas and
configs it would be created with (`SAGA_TOPICS__PARTITIONS`, `SAGA_TOPICS__REPLICATION_FACTOR`);
`create` makes the missing ones and leaves existing ones as they are (run it again at will);
`check` compares the cluster with the plan and exits 1 on a problem: a missing topic, fewer
partitions than planned, a compacted topic, or a record limit below the processor's.
"""

from __future__ import annotations

import argparse
import json
import sys

from processor._cli.inspect import EXIT_NOT_SENT
from processor._errors import RuntimeFailure
from processor._ports.cluster import TopicPlan
from processor.ops._topics import check_topics, plan_topics
from processor.settings import ProcessorSettings

ACTIONS = ("plan", "create", "check")


def topics_arguments(parser: argparse.ArgumentParser) -> None:
    """The action, and `--json`."""
    parser.add_argument("action", choices=ACTIONS, help="print, create or check the topics")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def topics(args: argparse.Namespace, settings: ProcessorSettings) -> int:
    """Runs the action; returns the exit code.

    0; 1 when `check` found a problem; 2 when the cluster refused a topic (e.g. more replicas
    than brokers); 3 when the cluster did not answer.
    """
    from processor._cli.commands import adapters, app_of
    from processor._cli.preflight import topic_names
    from processor._runtime.assembly import bind_sagas, open_sagas

    with open_sagas(settings, app_of(args)) as (saga_classes, dependencies):
        bound = bind_sagas(settings, saga_classes, dependencies=dependencies)
        read, written = topic_names(settings, bound)
    limit = settings.consumer.max_record_bytes
    plans = plan_topics(
        read,
        written,
        partitions=settings.topics.partitions,
        replication_factor=settings.topics.replication_factor,
        max_record_bytes=limit,
    )
    made = adapters(settings)
    if args.action == "plan":
        _print(args, [_planned(p) for p in plans], [_line(p) for p in plans])
        return 0
    if args.action == "create":
        try:
            created = made.create_topics(plans)
        except TimeoutError:
            # The creation requests went unanswered: whether any topic was made is unknown.
            print("saga-processor: the Kafka cluster did not answer in time", file=sys.stderr)
            return EXIT_NOT_SENT
        rows = [{**_planned(p), "result": created[p.name]} for p in plans]
        lines = [f"{created[p.name]:<8} {_line(p)}" for p in plans]
        _print(args, rows, lines)
        return 0
    try:
        found = made.describe_topics([p.name for p in plans])
    except RuntimeFailure as e:
        print(f"saga-processor: the Kafka cluster did not answer: {e}", file=sys.stderr)
        return EXIT_NOT_SENT
    verdict = check_topics(plans, found, limit)
    text = [f"PROBLEM {x}" for x in verdict.problems] + [f"note    {x}" for x in verdict.notes]
    text.append(f"{len(plans)} topics checked: {'ok' if verdict.ok else 'PROBLEMS FOUND'}")
    report = {"ok": verdict.ok, "problems": verdict.problems, "notes": verdict.notes}
    _print(args, report, text)
    return 0 if verdict.ok else 1


def _planned(plan: TopicPlan) -> dict[str, object]:
    return {
        "topic": plan.name,
        "role": plan.role,
        "partitions": plan.partitions,
        "replication_factor": plan.replication_factor,
        "configs": dict(plan.configs),
    }


def _line(plan: TopicPlan) -> str:
    configs = " ".join(f"{k}={v}" for k, v in sorted(plan.configs.items()))
    return (
        f"{plan.name}  ({plan.role})  partitions={plan.partitions} "
        f"replication.factor={plan.replication_factor} {configs}"
    )


def _print(args: argparse.Namespace, data: object, lines: list[str]) -> None:
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print("\n".join(lines))
