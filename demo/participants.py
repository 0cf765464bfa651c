"""Runs the order saga's participants (inventory, payment, fraud review, shipping) on the kit.

``python -m demo.participants --schema orders_svc --prefix demo. --stock sku-1=100
--wallets c-1=500`` creates the services' tables (and sets the given stock and balances), then
consumes ``order-commands`` until SIGTERM. Defaults come from the processor's ``SAGA_*``
variables, so it can share the processor's environment.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal

import schemas  # noqa: F401 - registers the example message types
from demo.orders import create_tables, order_participants, stock_up
from processor.participant.definition import participant_of
from processor.participant.service import SHUTDOWN_TIMEOUT, ParticipantService
from processor.runtime.hooks import Hooks
from processor.runtime.stopping import ShutdownBound, exit_now, on_stop_signals
from processor.settings import ConsumerSettings, RelaySettings

log = logging.getLogger(__name__)


def _pairs(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = item.partition("=")
        out[name] = value
    return out


def build(
    *,
    bootstrap: str,
    database_url: str,
    schema: str,
    prefix: str = "",
    group_id: str | None = None,
    only: Sequence[str] = (),
    application_name: str = "demo-order-participants",
    hooks: Hooks | None = None,
    shutdown_timeout: timedelta = SHUTDOWN_TIMEOUT,
) -> ParticipantService:
    """The order participants (those named in ``only``, or all) as one service."""
    chosen = [
        p for p in order_participants(schema) if not only or participant_of(type(p)).name in only
    ]
    return ParticipantService(
        chosen,
        kafka={"bootstrap.servers": bootstrap},
        database_url=database_url,
        schema=schema,
        group_id=group_id or f"{prefix}order-participants",
        topic_prefix=prefix,
        consumer=ConsumerSettings(session_timeout=timedelta(seconds=6)),
        relay=RelaySettings(poll_interval=timedelta(milliseconds=200)),
        application_name=application_name,
        hooks=hooks,
        shutdown_timeout=shutdown_timeout,
    )


def main(argv: Sequence[str] | None = None, hooks: Hooks | None = None) -> int:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m demo.participants", description=__doc__)
    p.add_argument("--bootstrap", default=env("SAGA_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    p.add_argument(
        "--database-url",
        default=env("SAGA_DATABASE__URL", "postgresql://saga:saga@127.0.0.1:55432/saga"),
    )
    p.add_argument("--schema", default=env("ORDERS_SCHEMA", "demo_orders"))
    p.add_argument("--prefix", default=env("SAGA_TOPIC_PREFIX", ""), help="topic prefix")
    p.add_argument("--group", default=None, help="consumer group")
    p.add_argument("--only", default="", help="participant names, e.g. inventory,payment")
    p.add_argument("--stock", default="", help="stock levels, e.g. sku-1=100")
    p.add_argument("--wallets", default="", help="wallet balances, e.g. c-1=500.00")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=SHUTDOWN_TIMEOUT.total_seconds(),
        help="seconds a stop may take (default %(default)s)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = build(
        bootstrap=args.bootstrap,
        database_url=args.database_url,
        schema=args.schema,
        prefix=args.prefix,
        group_id=args.group,
        only=[n for n in args.only.split(",") if n],
        hooks=hooks,
        shutdown_timeout=timedelta(seconds=args.shutdown_timeout),
    )
    stock = {k: int(v) for k, v in _pairs(args.stock).items()}
    wallets = {k: Decimal(v) for k, v in _pairs(args.wallets).items()}
    with service.store.transaction() as tx:
        create_tables(tx.sql, args.schema)
        if stock or wallets:
            stock_up(tx.sql, args.schema, stock, wallets)
    # SIGTERM ends the process within the service's shutdown budget, broker or not.
    bound = ShutdownBound(service.shutdown_timeout)
    on_stop_signals(service.stop, bound)
    bound.watch(service.stop_event)
    log.info("order participants up: schema %s, topics %s", args.schema, service.topics)
    service.run()
    c = service.kit.counters
    log.info(
        "stopped: %d handled, %d duplicates, %d expired, %d dead-lettered",
        c.handled,
        c.duplicates,
        c.expired,
        c.dead_lettered,
    )
    if service.left_running:
        exit_now(0)  # a close still waits on the broker; finalisation would wait on it
    return 0


if __name__ == "__main__":
    sys.exit(main())
