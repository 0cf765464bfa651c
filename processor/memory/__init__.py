"""In-memory adapters for unit tests and the saga test fixture.

Each implements a port of :mod:`processor.ports` with the same observable rules as its
PostgreSQL or Kafka counterpart (the contract suite in ``tests/contract`` checks that), and
offers a few extra methods to arrange state and inject failures. No client library is imported.
"""
