"""Benchmarks that report the engine's speed as ratios against raw limits measured in the same run.

Shared machines are noisy, so absolute numbers mean little; each scenario measures what plain
confluent-kafka and plain psycopg loops achieve on the same machine, at the same moment, and
reports the engine against them. Run with ``python -m benchmarks [s1|s4|all] [--quick]``.
"""
