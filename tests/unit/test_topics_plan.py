"""The topics plan and its comparison with the cluster (pure; the CLI feeds both)."""

from __future__ import annotations

from processor._ports.cluster import TopicFound, TopicPlan
from processor.ops._topics import check_topics, plan_topics

LIMIT = 1_048_576


def _plans() -> list[TopicPlan]:
    return plan_topics(
        ["p.events", "p.events"],
        ["p.commands", "p.saga-dead-letters", "p.events"],
        partitions=6,
        replication_factor=3,
        max_record_bytes=LIMIT,
    )


def test_the_plan_lists_each_topic_once_with_its_role_and_configs() -> None:
    plans = _plans()
    assert [(p.name, p.role) for p in plans] == [
        ("p.events", "reads"),
        ("p.commands", "writes"),
        ("p.saga-dead-letters", "writes"),
    ]
    assert {(p.partitions, p.replication_factor) for p in plans} == {(6, 3)}
    assert plans[0].configs == {"cleanup.policy": "delete", "max.message.bytes": "1064960"}


def test_a_matching_cluster_passes_and_a_grown_topic_is_only_a_note() -> None:
    ok = {p.name: TopicFound(6, dict(p.configs)) for p in _plans()}
    assert check_topics(_plans(), ok, LIMIT).ok
    grown = {**ok, "p.events": TopicFound(12, {})}
    verdict = check_topics(_plans(), grown, LIMIT)
    assert verdict.ok
    assert verdict.notes == [
        "topic 'p.events' (the processor reads it) has 12 partitions, more than the planned 6: "
        "a growth, which the processor follows"
    ]


def test_every_mismatch_is_a_problem_naming_its_topic() -> None:
    found = {
        "p.events": TopicFound(2, {"cleanup.policy": "delete"}),
        "p.commands": TopicFound(6, {"cleanup.policy": "compact,delete"}),
        "p.saga-dead-letters": TopicFound(6, {"max.message.bytes": "1000"}),
    }
    problems = check_topics(_plans(), found, LIMIT).problems
    assert len(problems) == 3
    assert problems[0].startswith("topic 'p.events' (the processor reads it) has 2 partition(s)")
    assert "cleanup.policy=compact,delete" in problems[1]
    assert "'p.commands'" in problems[1]
    assert "max.message.bytes=1000, below the 1048576 bytes" in problems[2]
    missing = check_topics(_plans(), {}, LIMIT).problems
    assert missing[0] == (
        "topic 'p.events' (the processor reads it) does not exist: `saga-processor topics create`"
    )
