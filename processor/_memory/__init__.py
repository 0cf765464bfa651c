"""In-memory adapters of the ports, for unit tests and the saga fixture.

They keep the same rules as the PostgreSQL and Kafka adapters (compare-and-set on epochs and
versions, one applied row per message id, claims in commit order); ``tests/contract`` runs the
same cases against both sets to keep it so.
"""
