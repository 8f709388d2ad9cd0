"""Matrix canonical JSON: the byte form that hashes and signatures are computed over.

Keys sorted by code point, no insignificant whitespace, UTF-8 (not ``\\u`` escapes) for
non-ASCII text. Room versions 6+ are *strict*: integers must lie in +-(2**53-1) and floats
are not allowed; older versions must still hash events that break those limits, so the
relaxed form only serialises.
"""
from __future__ import annotations

import json
from typing import Any

MAX_SAFE_INTEGER = 2**53 - 1

_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=True
)


class InvalidCanonicalJson(ValueError):
    """The value cannot be part of a strict-canonical-JSON event (v6+)."""


def check_strict(value: Any, path: str = "") -> None:
    """Raise :class:`InvalidCanonicalJson` if ``value`` has a float or an integer outside
    the range every JSON implementation represents exactly."""
    t = type(value)
    if t is dict:
        for k, v in value.items():
            check_strict(v, f"{path}.{k}")
    elif t is list:
        for i, v in enumerate(value):
            check_strict(v, f"{path}[{i}]")
    elif t is float:
        raise InvalidCanonicalJson(f"float at {path or '.'}: {value!r}")
    elif t is int and not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise InvalidCanonicalJson(f"integer out of range at {path or '.'}: {value}")


def encode(value: Any, *, strict: bool = False) -> bytes:
    """The canonical JSON bytes of ``value`` (``strict`` for room versions 6+)."""
    if strict:
        check_strict(value)
    try:
        return _encoder.encode(value).encode("utf-8")
    except ValueError as e:  # NaN/Infinity, lone surrogates
        raise InvalidCanonicalJson(str(e)) from None
