"""A simulated accounts and wallet service: consumes commands, moves money, answers with events.

One batch at a time: every command of the batch is applied in one PostgreSQL transaction (see
``ledger``), then the replies are produced and acknowledged, then the Kafka offsets are
committed. A crash anywhere in between redelivers the commands, and the ledger answers them with
the replies it stored the first time, so nothing is applied twice and no answer is lost for good.

It outlives restarts of PostgreSQL and of the Kafka broker: a batch that fails is rewound and
tried again with backoff; a lost database connection is replaced (the ledger keeps nothing in
memory, so a fresh connection is all it needs); librdkafka reconnects to the broker by itself,
and a producer that reports a fatal error is replaced.

Faults for the demo and tests, chosen deterministically from the transfer id: the reply of a step
can be "lost" (applied, never sent), so the saga's payment timeout fires; or sent twice under one
message id, so the processor must recognise the duplicate; or the command itself can be dropped
on its first delivery (never applied), as if it were delayed in transit.

Run alone: ``python -m demo.accounts --help`` (defaults come from the processor's
``SAGA_*`` variables, so it can share the processor's environment).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

import schemas  # noqa: F401 - registers the example message types
from demo.ledger import STEP_OF, Conn, Ledger, Reply
from processor.errors import UnknownMessageType
from processor.messages import (
    HEADER_CAUSATION_ID,
    HEADER_CORRELATION_ID,
    HEADER_MESSAGE_ID,
    HEADER_MESSAGE_TYPE,
    HEADER_OCCURRED_AT,
    HEADER_SCHEMA_VERSION,
    MessageRegistry,
    registry,
)
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC
from schemas.wallets import WALLET_COMMANDS_TOPIC

log = logging.getLogger(__name__)

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Selection:
    """Transfers picked for a fault: named ones, plus a fraction chosen by hashing the id.

    Hashing (not randomness) keeps the choice stable across redeliveries and restarts, so a
    redelivered command of a picked transfer is treated like the first one.
    """

    transfer_ids: frozenset[str] = frozenset()
    fraction: float = 0.0
    steps: frozenset[str] = frozenset({"debit"})

    def picks(self, transfer_id: str, step: str) -> bool:
        if step not in self.steps:
            return False
        if transfer_id in self.transfer_ids:
            return True
        digest = hashlib.sha256(transfer_id.encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.fraction


@dataclass
class Counters:
    commands: int = 0
    duplicates: int = 0
    replies: int = 0
    lost: set[str] = field(default_factory=set)
    skipped: int = 0
    dropped: int = 0
    failed_batches: int = 0


class AccountsService:
    """Consumes account and wallet commands; ``poll_once()`` is one batch, ``run()`` loops."""

    def __init__(
        self,
        *,
        kafka: Mapping[str, str],
        database_url: str,
        schema: str,
        topic_prefix: str = "",
        group_id: str | None = None,
        lose: Selection = Selection(),
        duplicate: Selection = Selection(),
        drop: Selection = Selection(),
        batch_size: int = 200,
        message_registry: MessageRegistry = registry,
        application_name: str = "demo-accounts",
    ) -> None:
        if not _IDENTIFIER.match(schema):
            raise ValueError(f"{schema!r} is not a plain lower-case SQL identifier")
        self.prefix = topic_prefix
        self.lose = lose
        self.duplicate = duplicate
        self.drop = drop
        self._dropped: set[tuple[str, str]] = set()
        self.batch_size = batch_size
        self.registry = message_registry
        self.counters = Counters()
        self._connect: Callable[[], Conn] = lambda: psycopg.connect(
            database_url, application_name=application_name, connect_timeout=5
        )
        self.ledger = Ledger(self._connect(), schema, message_registry)
        self.ledger.create()
        self.consumer = Consumer(
            {
                **kafka,
                "group.id": group_id or f"{topic_prefix}accounts",
                "auto.offset.reset": "earliest",
                # Offsets are committed only after the batch's replies are acknowledged.
                "enable.auto.commit": False,
                "session.timeout.ms": 10000,
            }
        )
        self.consumer.subscribe(
            [topic_prefix + ACCOUNT_COMMANDS_TOPIC, topic_prefix + WALLET_COMMANDS_TOPIC]
        )
        self._producer_config = {**kafka, "enable.idempotence": True, "linger.ms": 2}
        self.producer = Producer(self._producer_config)
        self.reconnects = 0
        self.stop_event = threading.Event()

    def open_accounts(self, balances: Mapping[str, Decimal], closed: Iterable[str] = ()) -> None:
        self.ledger.open_accounts(balances, closed)

    def poll_once(self, timeout: float = 0.2) -> int:
        """Applies, answers and acknowledges one batch; returns how many commands it held."""
        batch = []
        for msg in self.consumer.consume(num_messages=self.batch_size, timeout=timeout):
            err = msg.error()
            if err is None:
                batch.append(msg)
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("accounts consumer: %s", err)
        if not batch:
            return 0
        outgoing: list[tuple[str, str, Reply, dict[str, str]]] = []
        try:
            with self.ledger.conn.transaction():
                for msg in batch:
                    outgoing.extend(self._apply(msg))
            self._publish(outgoing)
        except Exception:
            # Rewind to the batch's first offsets: the commands come back, and those already
            # applied are answered from the stored replies.
            firsts: dict[tuple[str | None, int | None], int | None] = {}
            for msg in batch:
                firsts.setdefault((msg.topic(), msg.partition()), msg.offset())
            for (topic, part), offset in firsts.items():
                if topic is not None and part is not None and offset is not None:
                    # A partition revoked meanwhile cannot be sought; its next owner starts
                    # from the committed offset, which is before this batch anyway.
                    with contextlib.suppress(KafkaException):
                        self.consumer.seek(TopicPartition(topic, part, offset))
            raise
        self.consumer.commit(asynchronous=False)
        self.counters.commands += len(batch)
        return len(batch)

    def _apply(self, msg: Any) -> list[tuple[str, str, Reply, dict[str, str]]]:
        headers = {k: (v or b"").decode() for k, v in (msg.headers() or ())}
        try:
            version = headers.get(HEADER_SCHEMA_VERSION)
            cls = self.registry.by_name(
                headers.get(HEADER_MESSAGE_TYPE, ""), int(version) if version else None
            ).cls
            command = cls.model_validate_json(msg.value() or b"")
        except (UnknownMessageType, ValueError) as e:
            # A real service would dead-letter it; here it only has to be visible.
            log.warning(
                "skipping unreadable command at %s/%d@%d: %s",
                msg.topic(),
                msg.partition(),
                msg.offset(),
                type(e).__name__,
            )
            self.counters.skipped += 1
            return []
        if type(command) not in STEP_OF:
            self.counters.skipped += 1
            return []
        tid: str = getattr(command, "transfer_id")  # noqa: B009
        step = STEP_OF[type(command)]
        if self.drop.picks(tid, step) and (tid, step) not in self._dropped:
            self._dropped.add((tid, step))
            self.counters.dropped += 1
            return []
        result = self.ledger.apply(command)
        self.counters.duplicates += result.duplicate
        if result.reply is None:
            return []
        if self.lose.picks(tid, step):
            self.counters.lost.add(tid)
            return []
        reply_headers = {
            HEADER_CORRELATION_ID: headers.get(HEADER_CORRELATION_ID) or tid,
            HEADER_CAUSATION_ID: headers.get(HEADER_MESSAGE_ID, ""),
        }
        topic = self.prefix + (self.registry.by_name(result.reply.type_name).topic or "")
        copies = 2 if self.duplicate.picks(tid, step) else 1
        return [(topic, tid, result.reply, reply_headers)] * copies

    def _publish(self, outgoing: Sequence[tuple[str, str, Reply, dict[str, str]]]) -> None:
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                errors.append(err)

        now = datetime.now(UTC).isoformat()
        for topic, key, reply, extra in outgoing:
            headers = {
                HEADER_MESSAGE_ID: reply.message_id,
                HEADER_MESSAGE_TYPE: reply.type_name,
                HEADER_SCHEMA_VERSION: str(reply.version),
                HEADER_OCCURRED_AT: now,
                **extra,
            }
            self.producer.produce(
                topic,
                key=key.encode(),
                value=reply.value.encode(),
                headers=[(k, v.encode()) for k, v in headers.items()],
                on_delivery=delivered,
            )
        if self.producer.flush(30) or errors:
            raise KafkaException(errors[0] if errors else KafkaError(KafkaError._MSG_TIMED_OUT))
        self.counters.replies += len(outgoing)

    def run(self, stop: threading.Event | None = None) -> None:
        """Loops ``poll_once()`` until ``stop`` (or ``self.stop_event``) is set.

        A failed batch is tried again after a growing pause (at most 5 s); a broken database
        connection is replaced first, and a producer in a fatal state is recreated.
        """
        stop = stop or self.stop_event
        failures = 0
        while not stop.is_set():
            try:
                self.poll_once()
                failures = 0
            except (KafkaException, psycopg.Error) as e:
                failures += 1
                self.counters.failed_batches += 1
                log.warning("accounts batch failed (%s), retrying: %s", type(e).__name__, e)
                stop.wait(_backoff(failures))
                if isinstance(e, psycopg.Error) and self._connection_lost(e):
                    self._reconnect(stop)
                elif isinstance(e, KafkaException) and _fatal(e):
                    self._new_producer()

    def _connection_lost(self, error: psycopg.Error) -> bool:
        conn = self.ledger.conn
        return isinstance(error, psycopg.OperationalError) or conn.closed or conn.broken

    def _reconnect(self, stop: threading.Event) -> None:
        """Replaces the ledger's connection; tries until it works or ``stop`` is set."""
        with contextlib.suppress(psycopg.Error):
            self.ledger.conn.close()
        attempts = 0
        while not stop.is_set():
            try:
                self.ledger.conn = self._connect()
            except psycopg.Error as e:
                attempts += 1
                log.warning("accounts database unreachable (%s); trying again", type(e).__name__)
                stop.wait(_backoff(attempts))
                continue
            self.reconnects += 1
            log.info("accounts database connection replaced")
            return

    def _new_producer(self) -> None:
        log.warning("accounts producer in a fatal state; replacing it")
        with contextlib.suppress(KafkaException):
            self.producer.flush(1)
        self.producer = Producer(self._producer_config)

    def total(self) -> Decimal:
        """Sum of every balance; equal before and after any set of finished transfers."""
        return self.ledger.total()

    def close(self) -> None:
        self.consumer.close()
        self.producer.flush(5)
        self.ledger.conn.close()


def _backoff(failures: int) -> float:
    return float(min(5.0, 0.2 * 2 ** min(failures, 5)))


def _fatal(error: KafkaException) -> bool:
    """True when the client cannot go on (e.g. an idempotent producer's sequence broke)."""
    err = error.args[0] if error.args else None
    return isinstance(err, KafkaError) and err.fatal()


# -- command line ------------------------------------------------------------------------------


def _balances(text: str) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, amount = item.partition("=")
        out[name] = Decimal(amount or "0")
    return out


def _ids(text: str) -> frozenset[str]:
    return frozenset(filter(None, (p.strip() for p in text.split(","))))


def main(argv: Sequence[str] | None = None) -> int:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m demo.accounts", description=__doc__)
    p.add_argument("--bootstrap", default=env("SAGA_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    p.add_argument(
        "--database-url",
        default=env("SAGA_DATABASE__URL", "postgresql://saga:saga@127.0.0.1:55432/saga"),
    )
    p.add_argument("--schema", default=env("ACCOUNTS_SCHEMA", "demo_accounts"))
    p.add_argument("--prefix", default=env("SAGA_TOPIC_PREFIX", ""), help="topic prefix")
    p.add_argument("--accounts", default="", help="open accounts, e.g. A=100,B=50.00")
    p.add_argument("--closed", default="", help="comma-separated accounts that refuse credits")
    p.add_argument("--lose", default="", help="transfer ids whose debit replies are lost")
    p.add_argument("--lose-fraction", type=float, default=0.0)
    p.add_argument("--duplicate-fraction", type=float, default=0.0)
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    steps = frozenset(STEP_OF.values())
    service = AccountsService(
        kafka={"bootstrap.servers": args.bootstrap},
        database_url=args.database_url,
        schema=args.schema,
        topic_prefix=args.prefix,
        lose=Selection(_ids(args.lose), args.lose_fraction),
        duplicate=Selection(fraction=args.duplicate_fraction, steps=steps),
    )
    balances = _balances(args.accounts)
    closed = _ids(args.closed)
    if balances or closed:
        service.open_accounts({**dict.fromkeys(closed, Decimal(0)), **balances}, closed)
    signal.signal(signal.SIGTERM, lambda *_: service.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: service.stop_event.set())
    log.info("accounts service up: schema %s, prefix %r", args.schema, args.prefix)
    try:
        service.run()
    finally:
        service.close()
    c = service.counters
    log.info(
        "stopped: %d commands, %d duplicates, %d replies, %d lost",
        c.commands,
        c.duplicates,
        c.replies,
        len(c.lost),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
