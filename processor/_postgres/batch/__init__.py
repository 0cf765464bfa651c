"""The consumer's batch over PostgreSQL: the port's handle, its SQL and the rows it binds.

:class:`~processor._postgres.batch.handle.PostgresBatchStore` (the port) owns the connection;
:class:`~processor._postgres.batch.store.BatchSql` runs the statements of ``sql`` on it, with
rows encoded by ``rows``; ``operator_reads`` are the load's reads for operator records.
"""
