"""The engine's pure core: decoding records and planning one batch's writes. No I/O here."""
