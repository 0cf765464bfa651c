"""Orchestrates the demo: services, topics, processor replicas, accounts service, traffic, display.

It also serves the read-only web console over the run's schema and prints its URL; with `--keep`
the console stays up after the run until Ctrl-C.

Everything it starts it stops, in reverse order, whatever happens: the console and the replicas
first (SIGTERM, then SIGKILL past a deadline), then the accounts service, then its topics and
schemas, then the services this run started (see `devstack`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO

import psycopg

# NewTopic is re-exported by the admin module without being listed in its stubs' exports.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from psycopg import sql

import devstack
from demo.accounts import AccountsService, Selection
from demo.order_demo import (
    ORDER_SAGA,
    ORDER_TOPICS,
    order_plan,
    order_tally,
    publish_orders,
    start_order_bank,
    start_order_participants,
    start_order_person,
)
from demo.progress import Monitor, line, summary
from demo.traffic import TRANSFER_SAGA, WALLET_SAGA, Scenario, publish, scenario
from demo.trips import TRIP_FUNCTION, TRIP_TOPICS, publish_trips, trip_plan, trip_tally
from processor.ops import Adapters
from processor.publish import with_client_logging as logged
from processor.settings import ProcessorSettings
from schemas.transfers import ACCOUNT_COMMANDS_TOPIC, TRANSFER_EVENTS_TOPIC
from schemas.wallets import WALLET_COMMANDS_TOPIC, WALLET_EVENTS_TOPIC

REPO = Path(__file__).resolve().parents[1]
DEAD_LETTERS = "saga-dead-letters"
PAYMENT_TIMEOUT_S = 5
# The order saga's payment and fraud-review timeouts in the demo (15 minutes and a day shipped).
ORDER_STEP_TIMEOUT_S = 5
# Signs the demo person's `saga resolve` requests; the replicas accept records signed with it.
OPERATOR_KEY = "demo-operator-key"
PARTITIONS = 4


def say(text: str) -> None:
    print(text, flush=True)


def _topics(cleanup: ExitStack, kafka: str, prefix: str, keep: bool) -> None:
    admin = AdminClient(logged({"bootstrap.servers": kafka}))
    names = [
        prefix + t
        for t in (
            TRANSFER_EVENTS_TOPIC,
            ACCOUNT_COMMANDS_TOPIC,
            WALLET_EVENTS_TOPIC,
            WALLET_COMMANDS_TOPIC,
            *ORDER_TOPICS,
            *TRIP_TOPICS,
            DEAD_LETTERS,
        )
    ]
    for future in admin.create_topics(
        [NewTopic(n, PARTITIONS, 1) for n in names], operation_timeout=30
    ).values():
        future.result()
    if not keep:
        cleanup.callback(_delete_topics, admin, names)


def _delete_topics(admin: AdminClient, names: list[str]) -> None:
    for future in admin.delete_topics(names, operation_timeout=30).values():
        try:
            future.result()
        except Exception as e:  # leftovers under a unique prefix harm nobody
            say(f"note: could not delete a demo topic: {e}")


def _drop_schemas(database: str, names: Sequence[str]) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def _free_port() -> int:
    # Asked of the OS just before the replica starts: several replicas (and other demos or
    # tests on the machine) each need their own metrics port.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _replica_env(
    kafka: str, database: str, schema: str, prefix: str, n: int, metrics_port: int
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "SAGA_INSTANCE_ID": f"demo-replica-{n}",
            "SAGA_APP": "sagas.app:app",
            "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka,
            "SAGA_DATABASE__URL": database,
            "SAGA_DATABASE__SCHEMA_NAME": schema,
            "SAGA_TOPIC_PREFIX": prefix,
            "SAGA_CONSUMER__GROUP_ID": f"{prefix}processor",
            "SAGA_CONSUMER__BATCH_TIMEOUT": "50ms",
            # Short, so a replica that dies is noticed quickly; the demo is short too.
            "SAGA_CONSUMER__SESSION_TIMEOUT": "6s",
            "SAGA_RELAY__POLL_INTERVAL": "200ms",
            "SAGA_DEADLINE__POLLING__INTERVAL": "1s",
            "SAGA_DEADLINE__LEASE_TTL": "4s",
            "SAGA_DEADLINE__REDISPATCH_AFTER": "3s",
            "SAGA_SHUTDOWN_TIMEOUT": "10s",
            "SAGA_SETTINGS": json.dumps(
                {
                    "transfer.payment-timeout": PAYMENT_TIMEOUT_S,
                    # Shipping to a remote customer fails twice, half a second apart, then
                    # asks a person.
                    "order.ship-retry": {"max_attempts": 2, "base_delay": "PT0.5S", "jitter": 0},
                    # The slow bank's customers and the unusual ones (nobody reviews them)
                    # reach these timeouts; every other payment and review answers in time.
                    "order.payment-timeout": f"PT{ORDER_STEP_TIMEOUT_S}S",
                    "order.review-timeout": f"PT{ORDER_STEP_TIMEOUT_S}S",
                }
            ),
            "SAGA_OPERATOR__KEY": OPERATOR_KEY,
            "SAGA_OPERATOR__NAME": "demo",
            "SAGA_METRICS__HOST": "127.0.0.1",
            "SAGA_METRICS__PORT": str(metrics_port),
        }
    )
    return env


class Replica:
    """One `python -m processor` process (a replica, or the console), its output in a log file."""

    def __init__(
        self, env: dict[str, str], log_path: Path, command: Sequence[str] = ("run",)
    ) -> None:
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("ab")
        self._terminated = False
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "processor", *command],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Ctrl-C reaches only the demo, which then stops the replicas gracefully, once.
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def terminate(self) -> None:
        # Once only: a second SIGTERM makes the processor skip its graceful shutdown.
        if self.alive() and not self._terminated:
            self._terminated = True
            self.popen.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
        self.terminate()
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
        self._log.close()


def _stop_all(replicas: Sequence[Replica]) -> None:
    # SIGTERM all first so they shut down in parallel, then wait for each.
    for r in replicas:
        r.terminate()
    for r in replicas:
        r.stop()


def _start_console(
    cleanup: ExitStack, env: dict[str, str], logs: Path, port: int
) -> tuple[Replica, str]:
    """The read-only web console over this run's schema, as `saga-processor console` serves it."""
    port = port or _free_port()
    env = {**env, "SAGA_INSTANCE_ID": "demo-console"}
    console = Replica(env, logs / "console.log", ("console", "--port", str(port)))
    cleanup.callback(console.stop)
    return console, f"http://127.0.0.1:{port}/"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return int(reply.status) == 200
    except (OSError, ValueError):
        return False


def _start_accounts(
    cleanup: ExitStack, kafka: str, database: str, schema: str, *, prefix: str, plan: Scenario
) -> AccountsService:
    service = AccountsService(
        kafka={"bootstrap.servers": kafka},
        database_url=database,
        schema=schema,
        topic_prefix=prefix,
        lose=Selection(plan.lost),
    )
    service.open_accounts(plan.balances, plan.closed)
    thread = threading.Thread(target=service.run, name="accounts", daemon=True)
    thread.start()

    def stop() -> None:
        service.stop_event.set()
        thread.join(10)
        service.close()

    cleanup.callback(stop)
    return service


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    stamp = time.strftime("%Y%m%d%H%M%S") + uuid.uuid4().hex[:4]
    prefix, schema, accounts_schema = f"demo-{stamp}.", f"demo_{stamp}", f"demo_{stamp}_accounts"
    orders_schema = f"demo_{stamp}_orders"
    plan = scenario(stamp, *((12, 6) if args.quick else (40, 20)))
    orders = order_plan(stamp, 9 if args.quick else 27)
    trips = trip_plan(stamp, 10 if args.quick else 35)
    expected = {
        TRANSFER_SAGA: plan.expected(TRANSFER_SAGA),
        WALLET_SAGA: plan.expected(WALLET_SAGA),
        ORDER_SAGA: orders.expected(),
        TRIP_FUNCTION: len(trips),
    }
    logs = Path(os.environ.get("SAGA_LOCAL_DIR", REPO / ".local")) / "demo" / stamp
    logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as cleanup:
        found = cleanup.enter_context(devstack.provide(say, keep=args.keep_stack))
        kafka, database = found.kafka_bootstrap, found.database_url
        say(f"run {stamp}: topics {prefix}*, schemas {schema} and {accounts_schema}, logs {logs}")
        _topics(cleanup, kafka, prefix, args.keep_data)
        if not args.keep_data:
            cleanup.callback(_drop_schemas, database, [schema, accounts_schema, orders_schema])
        # Migrate once up front so the display can read the tables before the replicas are up.
        settings = ProcessorSettings(database={"url": database, "schema_name": schema})
        Adapters(settings).ensure_schema()
        replicas: list[Replica] = []
        endpoints: list[str] = []
        for n in range(1, args.replicas + 1):
            port = _free_port()
            env = _replica_env(kafka, database, schema, prefix, n, port)
            replicas.append(Replica(env, logs / f"replica-{n}.log"))
            endpoints.append(f"replica {n}: http://127.0.0.1:{port}/metrics")
        cleanup.callback(_stop_all, replicas)
        console, console_url = _start_console(
            cleanup,
            _replica_env(kafka, database, schema, prefix, 0, _free_port()),
            logs,
            args.console_port,
        )
        say("metrics (Prometheus; /healthz and /readyz beside them): " + ", ".join(endpoints))
        service = _start_accounts(
            cleanup, kafka, database, accounts_schema, prefix=prefix, plan=plan
        )
        before = service.total()
        order_totals = start_order_participants(
            cleanup,
            _replica_env(kafka, database, schema, prefix, 0, _free_port()),
            database,
            orders_schema,
            plan=orders,
            spawn=lambda env: Replica(env, logs / "order-participants.log", ("participant", "run")),
        )
        orders_before = order_totals()
        decisions = start_order_person(
            cleanup, kafka, database, schema, prefix=prefix, key=OPERATOR_KEY
        )
        late_captures = start_order_bank(cleanup, kafka, database, orders_schema, prefix=prefix)
        monitor = Monitor(
            database,
            schema,
            {"bootstrap.servers": kafka},
            [prefix + ACCOUNT_COMMANDS_TOPIC, prefix + WALLET_COMMANDS_TOPIC],
        )
        cleanup.callback(monitor.close)
        publish({"bootstrap.servers": kafka}, prefix, plan.requests)
        publish_orders(kafka, prefix, orders)
        publish_trips(kafka, prefix, trips)
        say(
            f"{args.replicas} processor replicas, {len(plan.requests)} requests published "
            f"({len(plan.lost)} with lost debit replies; payment timeout {PAYMENT_TIMEOUT_S} s), "
            f"{orders.expected()} orders for the order saga's participants, {len(trips)} trips "
            "for the trip saga written as one function"
        )
        # The console starts beside the replicas; its URL is printed once it answers.
        up_by = time.monotonic() + 20
        while console.alive() and not _answers(console_url) and time.monotonic() < up_by:
            time.sleep(0.2)  # polling the console's port, with a deadline
        console_up = console.alive() and _answers(console_url)
        if console_up:
            say(f"console: {console_url} (read-only; up while the demo runs)")
        else:
            say(f"the console did not start; see {console.log_path}")
        show = _printer()
        finished = False
        while time.monotonic() - started < args.timeout:
            snap = monitor.snapshot()
            show(line(snap, time.monotonic() - started, expected))
            terminal = all(snap.count(t, "ended", "parked") >= n for t, n in expected.items())
            # Money is only all in accounts once every command sent has been applied.
            drained = snap.outbox == 0 and service.counters.commands >= snap.commands_sent
            if terminal and drained:
                finished = True
                break
            if not all(r.alive() for r in replicas):
                show("")
                say(f"a processor replica exited early; see {logs}")
                return 1
            time.sleep(1.0)  # the display's refresh rate, not a synchronisation
        show("")
        elapsed = time.monotonic() - started
        if not finished:
            say(f"FAILED: not every saga ended within {args.timeout:.0f} s; logs in {logs}")
            return 1
        after = service.total()
        lines, surprises = summary(plan.requests, monitor.outcomes(), monitor.fired())
        parked = sum(snap.count(t, "parked") for t in expected)
        say(f"== summary after {elapsed:.1f} s ==")
        for text in lines:
            say(text)
        say(f"  commands sent {snap.commands_sent}, dead letters {snap.dead_letters}")
        say(f"  parked sagas {parked}")
        # Partitions move between replicas as they join; this is who held what at the end.
        shares = ", ".join(f"{o} {n} ({r} records)" for o, n, r in monitor.split())
        say(f"  partitions per replica at the end: {shares}")
        if surprises:
            say("  ended otherwise than planned (a slow machine can make a payment time out):")
            for text in surprises:
                say(text)
        outcomes = order_tally(database, schema)
        tally = ", ".join(f"{n} {state.lower()}" for state, n in outcomes.items())
        # Every order ended with one outcome: the counts add up to the orders placed.
        added = "" if sum(outcomes.values()) == orders.expected() else " (DO NOT ADD UP)"
        say(f"  {ORDER_SAGA:<16} {orders.expected():3d} sagas: {tally}{added}")
        trip_outcomes = trip_tally(database, schema)
        trip_added = "" if sum(trip_outcomes.values()) == len(trips) else " (DO NOT ADD UP)"
        trip_text = ", ".join(f"{n} {state.lower()}" for state, n in trip_outcomes.items())
        say(f"  {TRIP_FUNCTION:<16} {len(trips):3d} sagas: {trip_text}{trip_added}")
        decided = decisions()
        say(
            f"  shipping escalated to a person {decided.get('ship', 0)} time(s); they decided to "
            "compensate (saga resolve)"
        )
        say(
            f"  fraud review escalated to a person {decided.get('fraud-review', 0)} time(s); "
            "they rejected the order (a review decision event)"
        )
        say(
            f"  payments captured by the slow bank after the saga gave up: {late_captures()}, "
            "each refunded"
        )
        orders_after = order_totals()
        conserved = before == after and orders_before == orders_after
        verdict = "money conserved" if conserved else "MONEY NOT CONSERVED"
        say(f"  {verdict}: sum of balances before {before}, after {after}")
        say(
            f"  orders: wallets before {orders_before[0]}, after {orders_after[0]}; "
            f"stock before {orders_before[1]}, after {orders_after[1]}"
        )
        ok = (
            conserved
            and parked == 0
            and snap.dead_letters == 0
            and snap.deadlines_fired > 0
            and not added
            and not trip_added
        )
        if args.keep and console_up:
            _keep(console, console_url)
        return 0 if ok else 1
    return 1  # pragma: no cover - the with block always returns


def _keep(console: Replica, url: str) -> None:
    """Keeps the console up after the run until Ctrl-C (or until it exits by itself)."""
    say(f"console stays up at {url}; Ctrl-C stops it and cleans up")
    try:
        while console.alive():
            time.sleep(1.0)  # waiting for the person, not a synchronisation
    except KeyboardInterrupt:
        say("stopping the console")


def _printer() -> Callable[[str], None]:
    """Rewrites one line on a terminal; prints one line per refresh otherwise (logs, tests)."""
    if not sys.stdout.isatty():
        return lambda text: say(text) if text else None
    width = {"last": 0}

    def show(text: str) -> None:
        if not text:  # end the live line, keeping its last state on screen
            sys.stdout.write("\n" if width["last"] else "")
        else:
            sys.stdout.write("\r" + text + " " * max(0, width["last"] - len(text)))
        sys.stdout.flush()
        width["last"] = len(text)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m demo",
        description="Runs the example sagas against a simulated accounts service with faults.",
    )
    p.add_argument("--quick", action="store_true", help="18 sagas instead of 60")
    p.add_argument("--keep-stack", action="store_true", help="leave the local stack running")
    p.add_argument("--keep-data", action="store_true", help="keep the run's topics and schemas")
    p.add_argument("--replicas", type=int, default=2, help="processor processes (default 2)")
    p.add_argument("--timeout", type=float, default=120.0, help="hard cap in seconds")
    p.add_argument(
        "--keep", action="store_true", help="keep the web console up after the run, until Ctrl-C"
    )
    p.add_argument(
        "--console-port", type=int, default=0, help="the console's port (default: a free one)"
    )
    try:
        return run(p.parse_args(argv))
    except KeyboardInterrupt:
        say("interrupted; everything started was stopped")
        return 130
