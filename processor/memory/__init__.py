"""In-memory adapters for unit tests and the saga fixture."""
