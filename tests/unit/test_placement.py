"""Keys checked against their partitions: the partitioner setting and records placed elsewhere."""

from __future__ import annotations

import logging

import pytest

from processor._engine.decode import Decoded, Operator, Reason, Rejected, decode
from processor._engine.partitioner import fits, matching, normalise, partition_for
from processor._engine.records import Record
from processor._runtime.consumer.placement import PlacementCheck
from processor._wire import OperatorAction, OperatorRecord
from processor.settings import ConsumerSettings
from tests.unit.test_plan import REG, Log, Noted

COUNT = 6


def _on(partition: int, saga_id: str) -> object:
    record = Log().event(Noted(order_id=saga_id))
    record.partition = partition
    return decode(record, REG, 1 << 20)


def _keys_that_differ(n: int) -> list[str]:
    """Saga ids that the two partitioners put on different partitions of COUNT."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        key = f"order-{i}"
        if partition_for(key.encode(), COUNT, "crc32") != partition_for(
            key.encode(), COUNT, "murmur2"
        ):
            out.append(key)
        i += 1
    return out


def test_the_default_is_librdkafkas_default_and_its_names_are_accepted() -> None:
    assert ConsumerSettings().partitioner == "crc32"
    assert ConsumerSettings(partitioner="consistent_random").partitioner == "crc32"
    assert ConsumerSettings(partitioner="murmur2_random").partitioner == "murmur2"
    with pytest.raises(ValueError, match="unknown partitioner 'fnv1a'"):
        normalise("fnv1a")


def test_a_key_fits_at_any_count_in_play() -> None:
    key = _keys_that_differ(1)[0].encode()
    at_six = partition_for(key, 6, "crc32")
    at_twelve = partition_for(key, 12, "crc32")
    assert fits(key, at_six, (6,), "crc32")
    # After a growth, a producer that has not refreshed still hashes with the old count.
    assert fits(key, at_six, (12, 6), "crc32")
    assert fits(key, at_twelve, (12, 6), "crc32")
    assert matching([(key, partition_for(key, 6, "murmur2"))], (6,)) == ["murmur2"]


def test_records_placed_by_another_partitioner_are_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check = PlacementCheck("crc32", lambda topic: (COUNT,))
    good, *bad = _keys_that_differ(3)
    records = [_on(partition_for(good.encode(), COUNT, "crc32"), good)]
    records += [_on(partition_for(k.encode(), COUNT, "murmur2"), k) for k in bad]
    with caplog.at_level(logging.WARNING):
        check.check(records)  # type: ignore[arg-type]
        check.check(records)  # type: ignore[arg-type]
    assert check.off_partition == {"in": 4}
    [line] = [r.getMessage() for r in caplog.records]
    assert "SAGA_CONSUMER__PARTITIONER=crc32" in line
    assert "the murmur2 partitioner would put it there" in line
    assert f"saga_id={bad[0]}" in line


def test_nothing_is_checked_while_the_counts_are_unknown() -> None:
    check = PlacementCheck("crc32", lambda topic: ())
    key = _keys_that_differ(1)[0]
    check.check([_on(partition_for(key.encode(), COUNT, "murmur2"), key)])  # type: ignore[list-item]
    assert check.off_partition == {}


def test_records_of_a_producer_that_missed_the_growth_are_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check = PlacementCheck("crc32", lambda topic: (12, 6))
    keys = [f"order-{i}" for i in range(40)]
    moved = [k for k in keys if partition_for(k.encode(), 12, "crc32") >= 6]
    stayed = [k for k in keys if partition_for(k.encode(), 12, "crc32") < 6]
    fresh = [_on(partition_for(k.encode(), 12, "crc32"), k) for k in keys]
    late = [_on(partition_for(k.encode(), 6, "crc32"), k) for k in moved[:3]]
    with caplog.at_level(logging.WARNING):
        check.check([*fresh, *late, *late])  # type: ignore[list-item]
    # A key that did not move is where both counts put it: nothing stale about it.
    assert stayed
    assert check.off_partition == {}
    assert check.stale == {"in": 6}
    [line] = [r.getMessage() for r in caplog.records]
    assert "has not learnt of its growth to 12 partitions" in line
    assert f"saga_id={moved[0]}" in line
    assert f"goes to partition {partition_for(moved[0].encode(), 12, 'crc32')} now" in line


def _operator_on(partition: int, saga_id: str) -> Operator:
    request = OperatorRecord(
        OperatorAction.TERMINATE, "unit-order", saga_id, "c1", "ana", "why", issued_at=0
    )
    headers = tuple((k, v.encode()) for k, v in request.headers(b"key").items())
    decoded = decode(
        Record("in", partition, 1, saga_id.encode(), request.value(), headers), REG, 1 << 20
    )
    assert isinstance(decoded, Operator)
    return decoded


def test_an_operator_record_off_its_sagas_partition_is_rejected_in_its_place() -> None:
    check = PlacementCheck("crc32", lambda topic: (COUNT,))
    saga_id = "order-1"
    home = partition_for(saga_id.encode(), COUNT, "crc32")
    at_home, elsewhere = _operator_on(home, saga_id), _operator_on((home + 1) % COUNT, saga_id)
    event = _on(home, saga_id)
    checked = check.check([event, elsewhere, at_home])  # type: ignore[list-item]
    assert checked[0] is event
    assert checked[2] is at_home
    rejected = checked[1]
    assert isinstance(rejected, Rejected)
    assert rejected.record is elsewhere.record
    assert rejected.reason == Reason.MISPLACED
    assert rejected.detail == (
        f"partition {(home + 1) % COUNT} is not its saga's: SAGA_CONSUMER__PARTITIONER=crc32 "
        f"puts the saga id on partition {home} of {COUNT}"
    )
    # Nothing to reject: the very list comes back.
    records: list[Decoded] = [event, at_home]
    assert check.check(records) is records


def test_an_operator_record_fits_at_any_count_in_play_and_is_kept_while_counts_are_unknown() -> (
    None
):
    saga_id = next(
        k for k in (f"order-{i}" for i in range(100)) if partition_for(k.encode(), 12, "crc32") >= 6
    )
    # Sent by a producer that still hashes with the count before the growth.
    old_home = _operator_on(partition_for(saga_id.encode(), 6, "crc32"), saga_id)
    assert PlacementCheck("crc32", lambda topic: (12, 6)).check([old_home]) == [old_home]
    anywhere = _operator_on(5, saga_id)
    assert PlacementCheck("crc32", lambda topic: ()).check([anywhere]) == [anywhere]
