"""What PostgreSQL can store of a record as an id, key or header value, and the checks for it.

A record that fails one is judged once, at decode, instead of failing its batch's write.
"""

from __future__ import annotations

__all__ = ["MAX_HEADER_VALUE_BYTES", "MAX_ID_BYTES", "escaped_nul", "id_problem", "key_problem"]

MAX_ID_BYTES = 512
"""Longest saga id, message id, record key or deadline name, in UTF-8 bytes.

Ids are btree-indexed text columns; PostgreSQL refuses an index row over about 2.7 kB, so a
longer id would fail the whole batch's write instead of its record being judged at decode."""

MAX_HEADER_VALUE_BYTES = 8192
"""Longest header value, in bytes; headers are stored as JSON with parked and dead records."""


def id_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored as an id (saga id, association value), or None if it can.

    Args:
        text: The id.

    Returns:
        A short phrase without the id's value, e.g. "holds a NUL character".
    """
    if "\x00" in text:
        return "holds a NUL character"
    if text.isascii():  # the common case: one byte per character, nothing to encode
        size = len(text)
    else:
        try:
            size = len(text.encode())
        except UnicodeEncodeError:  # a lone surrogate
            return "is not valid UTF-8"
    if size > MAX_ID_BYTES:
        return f"is over {MAX_ID_BYTES} bytes"
    return None


def key_problem(key: bytes | None) -> str | None:
    """Why a record key cannot be stored as a saga id, or None if it can (or there is none)."""
    if key is None:
        return None
    if b"\x00" in key:
        return "holds a NUL character"
    if len(key) > MAX_ID_BYTES:
        return f"is over {MAX_ID_BYTES} bytes"
    try:
        key.decode()
    except UnicodeDecodeError:
        return "is not valid UTF-8"
    return None


def escaped_nul(value: bytes) -> bool:
    """Whether JSON text ``value`` holds the escaped NUL character, which jsonb refuses."""
    # The slow path, only when the bytes occur at all: an odd run of backslashes before
    # "u0000" is the escape; an even run is a literal backslash followed by "u0000".
    start = value.find(b"\\u0000")
    while start >= 0:
        run = 0
        while start - run - 1 >= 0 and value[start - run - 1] == 0x5C:
            run += 1
        if run % 2 == 0:
            return True
        start = value.find(b"\\u0000", start + 1)
    return False
