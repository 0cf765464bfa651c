"""PostgreSQL adapter: the only part of the processor that imports psycopg.

By concern: the consumer's batch (:mod:`~processor._postgres.batch`), the tables and their
migrations (:mod:`~processor._postgres.schema`), the operators' reads
(:mod:`~processor._postgres.reads`); the other loops' stores, connections and error
translation are here.
"""
