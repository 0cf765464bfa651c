"""PostgreSQL adapter: the only part of the processor that imports psycopg."""
