"""`python -m benchmarks.console_queries [--sagas N]`: the console's queries on a big database.

Seeds a scratch schema with N sagas (default 1,000,000; a mix of types, statuses and machine
states), three history rows each, a few thousand parked messages and dead letters, then times
every query the console and `show` run (median and worst of 20 runs) against the goal of 100 ms.
A benchmark, not a test: it prints a table and writes `.local/bench/console-<time>.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.common import RESULTS_DIR, say, scratch, services, table
from processor._postgres.connect import connect
from processor._postgres.reads.inspect import InspectQueries

GOAL_MS = 100.0
RUNS = 20

_SEED = """
INSERT INTO {instance} (saga_type, saga_id, state, status, version, created_at, updated_at,
                        machine_state, machine_state_since)
SELECT 'type-' || (g %% 5), 's-' || g, jsonb_build_object('n', g),
       CASE WHEN g %% 100 = 0 THEN 'parked' WHEN g %% 3 = 0 THEN 'ended' ELSE 'active' END,
       3, now() - (g %% 100000) * interval '1 minute', now() - (g %% 90000) * interval '1 minute',
       (ARRAY['RUNNING', 'WAITING', 'COMPENSATING', 'COMPLETED'])[1 + g %% 4],
       now() - (g %% 80000) * interval '1 minute'
  FROM generate_series(1, %s) AS g;
INSERT INTO {history} (saga_type, saga_id, message_id, message_type, kind, outcome, version,
                       topic, partition, "offset", headers, payload, effects)
SELECT 'type-' || (g %% 5), 's-' || g, 'm-' || g || '-' || k, 'bench.Event', 'event', 'applied', k,
       'events', g %% 12, g * 3 + k, '{{"message-type": "bench.Event"}}'::jsonb,
       convert_to('{{"id": "' || g || '"}}', 'UTF8'), '{{"commands": []}}'::jsonb
  FROM generate_series(1, %s) AS g, generate_series(1, 3) AS k;
INSERT INTO {parked} (saga_type, saga_id, topic, partition, "offset", value, headers, reason)
SELECT 'type-' || (g %% 5), 's-' || g, 'events', 0, g, '{{}}', '{{}}', 'held'
  FROM generate_series(100, %s, 100) AS g;
INSERT INTO {dead_letter} (topic, partition, "offset", value, headers, reason)
SELECT 'events', 0, g, 'junk', '{{}}', 'unparseable' FROM generate_series(1, 5000) AS g;
ANALYZE;
"""


def _time(fn: Callable[[], Any]) -> dict[str, float]:
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return {"median_ms": statistics.median(times), "max_ms": max(times)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.console_queries")
    parser.add_argument("--sagas", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    with services() as found, scratch(found, "console") as box:
        tables = box.schema("console")
        with connect(found.database_url, autocommit=True) as conn:
            say(f"seeding {args.sagas:,} sagas and {3 * args.sagas:,} history rows")
            t0 = time.monotonic()
            for statement in tables.render(_SEED).split(";\n"):
                if statement.strip():
                    n = statement.count("%s")
                    conn.execute(statement, (args.sagas,) * n)
            say(f"seeded in {time.monotonic() - t0:.0f} s")
            q = InspectQueries(conn, tables)
            mid = f"s-{args.sagas // 2 + 1}"
            cursor = q.list_sagas(limit=50)[-1]
            after = (cursor.updated_at, cursor.saga_type, cursor.saga_id)
            cases: dict[str, Callable[[], Any]] = {
                "saga row": lambda: q.saga("type-1", "s-1"),
                "timeline": lambda: q.timeline("type-1", "s-1"),
                "deadlines": lambda: q.deadlines("type-1", "s-1"),
                "held messages": lambda: q.held("type-0", "s-100"),
                "failed outbox of a saga": lambda: q.failed("type-1", "s-1"),
                "search by id": lambda: q.find(mid),
                "sagas list, first page": lambda: q.list_sagas(limit=50),
                "sagas list, next page": lambda: q.list_sagas(after=after, limit=50),
                "sagas list by type+status": lambda: q.list_sagas(
                    saga_type="type-2", status="parked", limit=50
                ),
                "stuck (1 h)": lambda: q.stuck(older_than=timedelta(hours=1), limit=50),
                "dead letters page": lambda: q.dead_letters(limit=50),
                "overview": q.overview,
            }
            results = {name: _time(fn) for name, fn in cases.items()}
    rows = [
        (
            "console",
            name,
            f"median {r['median_ms']:.1f} ms, max {r['max_ms']:.1f} ms "
            f"({'PASS' if r['median_ms'] < GOAL_MS else 'BELOW'} < {GOAL_MS:.0f} ms)",
        )
        for name, r in results.items()
    ]
    print(table(rows, ("", "query", "time")))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS_DIR / f"console-{stamp}.json"
    out.write_text(json.dumps({"sagas": args.sagas, "queries": results}, indent=2))
    say(f"report: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
