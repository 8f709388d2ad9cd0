"""What an identifier or a stream position from a request may be, checked before any query.

PostgreSQL refuses text with a NUL byte (``DataError``) and SQLite integers past 64 bits
(``OverflowError``); Python's ``int()`` refuses more than 4,300 digits and accepts digits of
any script (``int("٣") == 3``). Each would reach the database or blow up as a 500. Synapse's
identifiers (user, room and event IDs) are at most 255 characters.
"""
from __future__ import annotations

import re

#: The largest stream ID or token a BIGINT column holds.
MAX_STREAM_ID = 2**63 - 1
#: Synapse's limit for user, room and event IDs (and ours for writer names).
MAX_IDENTIFIER_LENGTH = 255

_WHOLE_NUMBER = re.compile(r"-?[0-9]+")


def bad_identifier(name: str, value: str, max_length: int = MAX_IDENTIFIER_LENGTH) -> str | None:
    """Why ``value`` cannot be the identifier ``name`` (``None``: it can)."""
    if "\x00" in value:
        return f"{name} must not contain a NUL character"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return f"{name} must not contain control characters"
    if len(value) > max_length:
        return f"{name} is {len(value)} characters long; at most {max_length} are allowed"
    return None


def is_whole_number(text: str) -> bool:
    """ASCII digits with an optional sign (what ``int()`` should be given)."""
    return _WHOLE_NUMBER.fullmatch(text) is not None


def fits_stream_id(text: str) -> bool:
    """``text`` is a whole number a BIGINT column can hold (checked without ``int()`` on a
    huge string)."""
    if not is_whole_number(text):
        return False
    return len(text.lstrip("-")) <= 19 and -MAX_STREAM_ID - 1 <= int(text) <= MAX_STREAM_ID
