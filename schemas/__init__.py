"""Example event and command schemas.

Importing this package registers every message type in ``processor.message_registry``.
``python -m schemas.export`` writes their JSON Schemas for services in other languages.
"""

from schemas import orders, transfers, trips, wallets

__all__ = ["orders", "transfers", "trips", "wallets"]
