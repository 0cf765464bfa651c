"""The tests' Reader replaces a client that holds its partitions but fetches nothing while the
logs have records past it (librdkafka #5430 after a broker restart), at the positions it had."""

from __future__ import annotations

from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from tests.support.harness import Reader


class _Msg:
    def __init__(self, partition: int, offset: int) -> None:
        self._p, self._o = partition, offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


class _Client:
    """Partition 0 has two records, then the client wedges: it returns nothing more."""

    def __init__(self, high: int) -> None:
        self.high = high
        self.assigned: list[TopicPartition] = []
        self.closed = False
        self.given = False

    def list_topics(self, name: str, timeout: float) -> Any:
        meta = type("T", (), {"partitions": {0: None, 1: None}, "error": None})()
        return type("M", (), {"topics": {name: meta}})()

    def incremental_assign(self, parts: list[TopicPartition]) -> None:
        self.assigned += parts

    def assign(self, parts: list[TopicPartition]) -> None:
        self.assigned = parts

    def consume(self, num_messages: int, timeout: float) -> list[_Msg]:
        if self.given:
            return []
        self.given = True
        return [_Msg(0, 0), _Msg(0, 1)]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> Any:
        return (0, self.high if tp.partition == 0 else 0)

    def close(self) -> None:
        self.closed = True


def _reader(high: int) -> tuple[Reader, list[_Client]]:
    made: list[_Client] = []

    class Stubbed(Reader):
        STALL = 0.0

        def _client(self) -> Any:
            made.append(_Client(high))
            return made[-1]

    return Stubbed("unused:1", ["t"]), made


def test_a_client_fetching_nothing_while_the_log_is_ahead_is_replaced_at_its_positions() -> None:
    reader, made = _reader(high=5)
    reader.poll()
    assert reader.replaced == 1
    assert len(made) == 2
    assigned = {(tp.partition, tp.offset) for tp in made[1].assigned}
    assert assigned == {(0, 2), (1, OFFSET_BEGINNING)}
    assert [m.offset() for m in reader.records] == [0, 1]


def test_a_client_that_has_read_everything_is_kept() -> None:
    reader, made = _reader(high=2)
    reader.poll()
    reader.poll()
    assert reader.replaced == 0
    assert len(made) == 1
