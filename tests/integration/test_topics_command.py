"""`saga-processor topics plan|create|check` against a real broker.

On an empty broker (a prefix of its own), `create` makes every topic the example sagas read and
write, again without harm, and `check` then passes; a topic made by hand with too few
partitions, or compacted, makes `check` fail with a line naming it.
"""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from processor._cli import main

pytestmark = pytest.mark.integration

EXPECTED = [
    "account-commands",
    "saga-dead-letters",
    "transfer-events",
    "wallet-commands",
    "wallet-events",
]


@pytest.fixture
def prefix(kafka_bootstrap: str, database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"t{uuid.uuid4().hex[:8]}."
    for key, value in {
        "SAGA_SAGAS": '["sagas"]',
        "SAGA_DATABASE__URL": database_url,
        "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "SAGA_TOPIC_PREFIX": name,
        "SAGA_TOPICS__PARTITIONS": "3",
        "SAGA_TOPICS__REPLICATION_FACTOR": "1",
    }.items():
        monkeypatch.setenv(key, value)
    return name


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object]:
    code = main(["topics", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_create_on_an_empty_broker_then_check_passes(
    prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, plan = _json(capsys, "plan")
    assert code == 0
    assert isinstance(plan, list)
    assert sorted(p["topic"] for p in plan) == [prefix + t for t in EXPECTED]
    roles = {p["topic"]: p["role"] for p in plan}
    assert roles[prefix + "transfer-events"] == "reads"
    assert roles[prefix + "account-commands"] == "writes"

    assert main(["topics", "check"]) == 1
    assert "does not exist" in capsys.readouterr().out

    code, made = _json(capsys, "create")
    assert code == 0
    assert isinstance(made, list)
    assert {m["result"] for m in made} == {"created"}
    code, again = _json(capsys, "create")
    assert isinstance(again, list)
    assert {m["result"] for m in again} == {"exists"}

    assert main(["topics", "check"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("5 topics checked: ok"), out


def test_a_topic_with_too_few_partitions_or_compacted_fails_the_check(
    prefix: str, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    by_hand = [
        NewTopic(prefix + "transfer-events", 1, 1),
        NewTopic(prefix + "wallet-commands", 3, 1, config={"cleanup.policy": "compact"}),
    ]
    for future in admin.create_topics(by_hand, operation_timeout=30).values():
        future.result()
    code, made = _json(capsys, "create")
    assert code == 0
    assert isinstance(made, list)
    results = {m["topic"]: m["result"] for m in made}
    assert results[prefix + "transfer-events"] == "exists"
    assert results[prefix + "account-commands"] == "created"

    code, report = _json(capsys, "check")
    assert code == 1
    assert isinstance(report, dict)
    assert report["ok"] is False
    assert report["problems"] == [
        f"topic '{prefix}transfer-events' (the processor reads it) has 1 partition(s), fewer "
        "than the planned 3 (SAGA_TOPICS__PARTITIONS): add partitions to it",
        f"topic '{prefix}wallet-commands' (the processor writes it) has cleanup.policy=compact: "
        "compaction keeps only a key's latest record, so a saga's earlier records can be lost; "
        "use delete",
    ]
