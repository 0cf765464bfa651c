"""Tests that need a Citus coordinator as the database (make test's citus phase)."""
