"""The JSON of replication lines: Synapse's exact text, made and read fast (sans I/O).

The rules are Synapse's (``synapse/util/json.py``): a value goes out compact, ASCII only
(non-ASCII text and U+007F as ``\\uXXXX`` escapes), without NaN or Infinity, tuples and
read-only mappings as arrays and objects; a value comes in through the standard decoder
minus its Python extensions ``NaN``, ``Infinity`` and ``-Infinity``. :func:`encode_json`
and :func:`decode_json` are the standard library's ``json``, configured so, and are the
definition of what is right.

Rows are encoded and decoded by the million, so the hot paths take msgspec (a pinned
dependency) where it gives the very same result, and the standard library everywhere else:

* :func:`decode_row` (a worker, once per fact): msgspec's decoder, which reads bytes without
  decoding a ``str`` first. Where both accept a text they give the same value, numbers
  included (integers of any size, floats to the last bit; msgspec refuses ``NaN`` and
  ``Infinity`` literals, lone ``\\ud800`` escapes, floats that overflow and invalid UTF-8);
  anything msgspec refuses goes to :func:`decode_json`, whose value or error is the answer.
* :func:`encode_rows` (a writer, once per row): msgspec's encoder, whose bytes are the
  standard encoder's except for non-ASCII text and U+007F (msgspec writes them raw), floats
  (``1e16`` where Python writes ``1e+16``, ``null`` for NaN where the standard encoder
  refuses it) and the types it knows beyond JSON's. Its output is kept only when it is pure
  ASCII without U+007F and the value holds no float (msgspec's msgpack encoding of the same
  value has no float64 marker byte: the marker can also be an integer's byte, which only
  sends that row the slow way); every other row is the standard encoder's.

Values of types outside JSON's (sets, bytes, dates, UUIDs, dataclasses) never make a row:
rows are what the workers decode. msgspec encodes some of them where the standard encoder
raises ``TypeError``; mappings that are not dicts go through ``default`` on both paths.

:func:`use_fast_paths` switches msgspec off and on, for the benchmarks that measure both.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any

import msgspec

__all__ = [
    "encode_json",
    "decode_json",
    "encode_rows",
    "decode_row",
    "use_fast_paths",
]


def _encode_mapping(value: object) -> dict[Any, Any]:
    # Synapse serialises its immutabledict rows as objects; accept any read-only mapping.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _reject_constant(name: str) -> None:
    raise ValueError(f"Invalid JSON value: {name!r}")


# Byte for byte what Synapse's ``json_encoder`` produces: compact separators, no NaN or
# Infinity, tuples as arrays, and the stdlib default ``ensure_ascii=True`` (non-ASCII text
# goes out as ``\uXXXX`` escapes, so JSON fields are always pure ASCII).
_ENCODER = json.JSONEncoder(
    ensure_ascii=True, allow_nan=False, separators=(",", ":"), default=_encode_mapping
)
# The standard decoder, minus the Python extensions NaN, Infinity and -Infinity.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)

# Most of ``JSONEncoder.encode``'s cost is per-call Python set-up around the C encoder.
# Calling the C encoder directly, configured like _ENCODER, gives the same text about twice
# as fast (tests compare the two). It skips the circular-reference check, so a cyclic value
# fails with RecursionError instead of ValueError; format_command reports both the same way.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
if _c_make_encoder is not None:
    _c_iterencode = _c_make_encoder(
        None,  # no circular-reference markers
        _encode_mapping,  # default
        json.encoder.encode_basestring_ascii,  # ensure_ascii=True
        None,  # indent
        ":",  # key separator
        ",",  # item separator
        False,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )

    def _encode(value: Any) -> str:
        return "".join(_c_iterencode(value, 0))

else:  # pragma: no cover - Python builds without the _json accelerator
    _encode = _ENCODER.encode  # type: ignore[assignment]  # same signature, bound method


def encode_json(value: Any) -> str:
    """Serialise ``value`` the way Synapse does (compact, ASCII, no NaN or Infinity)."""
    return _encode(value)


_scan_once = _DECODER.scan_once  # type: ignore[attr-defined]  # set by JSONDecoder.__init__, not in typeshed


def decode_json(text: str) -> Any:
    """Parse one JSON value, rejecting ``NaN``, ``Infinity`` and ``-Infinity``."""
    # Fast path for the usual case, a value filling the whole text: the decoder's own
    # scanner without decode()'s whitespace handling. Anything else (surrounding
    # whitespace, extra data, nothing at all) goes through decode() for its exact errors.
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:
        return _DECODER.decode(text)
    if end != len(text):
        return _DECODER.decode(text)
    return value


# --- the fast paths -----------------------------------------------------------------------

_msgspec_json = msgspec.json.Encoder(enc_hook=_encode_mapping)
_msgspec_encode = _msgspec_json.encode
_msgspec_encode_lines = _msgspec_json.encode_lines
_msgspec_pack = msgspec.msgpack.Encoder(enc_hook=_encode_mapping).encode
#: msgpack's float64 marker: every float (NaN and Infinity too) of a value packed by
#: msgspec begins with it. In a pure-ASCII value's packing it can also be a byte of an
#: integer or of a length, which only costs that row the slow way.
_FLOAT64 = b"\xcb"
_fast = True


def _standard_row(data: bytes | str) -> Any:
    return decode_json(data.decode("utf-8") if isinstance(data, bytes) else data)


#: What reads a row first: msgspec's decoder (the standard library's with fast paths off).
#: Whatever it raises on, :func:`decode_row` hands to the standard decoder; a hot loop may
#: call it inline the same way.
row_decoder: Callable[[bytes | str], Any] = msgspec.json.Decoder().decode
_msgspec_decode = row_decoder


def use_fast_paths(enabled: bool) -> None:
    """Whether :func:`decode_row` and :func:`encode_rows` take msgspec where it is exact
    (the default) or the standard library alone (what the benchmarks compare against)."""
    global _fast, row_decoder
    _fast = enabled
    row_decoder = _msgspec_decode if enabled else _standard_row


def decode_row(data: bytes | str) -> Any:
    """:func:`decode_json` of ``data`` (a row's JSON as received: bytes are UTF-8), the same
    value or the same error, read by msgspec wherever msgspec accepts it."""
    try:
        return row_decoder(data)
    except Exception:  # what msgspec refuses, the standard decoder decides
        return _standard_row(data)


def _standard_bytes(value: Any) -> bytes:
    return _encode(value).encode("ascii")


def _packs_a_float(value: Any) -> bool:
    """Whether ``value`` may hold a float: its msgpack form has a float64 marker byte (or
    msgpack cannot carry it)."""
    try:
        return _FLOAT64 in _msgspec_pack(value)
    except Exception:
        return True


def _float_rows(rows: list[Any], found: set[int]) -> None:
    """Add to ``found`` every row of ``rows`` (whose packing has a float64 marker byte) that
    may hold a float: ten rows packed at a time, then the rows of the tens that have one (a
    call costs as much as packing a few rows: one per row would cost several passes)."""
    for lo in range(0, len(rows), 10):
        if _packs_a_float(rows[lo:lo + 10]):
            found.update(i for i in range(lo, min(lo + 10, len(rows))) if _packs_a_float(rows[i]))


def _indexes(flags: list[bool], value: bool) -> Iterator[int]:
    i = -1
    try:
        while True:
            i = flags.index(value, i + 1)
            yield i
    except ValueError:
        return


def encode_rows(rows: Sequence[Any]) -> list[bytes]:
    """:func:`encode_json` of each of ``rows``, as bytes: byte for byte the standard
    encoder's, or its error (the first row it refuses raises). msgspec encodes them all in
    one call; a row whose text is not pure ASCII without U+007F, or which may hold a float
    (module docstring), is the standard encoder's."""
    if not _fast:
        return [_standard_bytes(row) for row in rows]
    try:
        data: bytes = _msgspec_encode_lines(rows)
        packed: bytes = _msgspec_pack(rows)
    except Exception:  # some row msgspec refuses: each on its own
        return [_encode_row(row) for row in rows]
    out = data.split(b"\n")
    out.pop()  # after the last row's newline
    ascii_text = data.isascii() and b"\x7f" not in data
    if ascii_text and _FLOAT64 not in packed:
        return out  # the usual case
    # The rare rows, found by C-level passes (a Python loop over every row costs what the
    # standard encoder does), re-encoded in order: the first one it refuses raises.
    rows = list(rows)
    slow: set[int] = set()
    if not ascii_text:
        slow.update(_indexes(list(map(bytes.isascii, out)), False))
        slow.update(_indexes(list(map(bytes.__contains__, out, repeat(b"\x7f"))), True))
    if _FLOAT64 in packed:
        _float_rows(rows, slow)
    for i in sorted(slow):
        out[i] = _standard_bytes(rows[i])
    return out


def _encode_row(value: Any) -> bytes:
    """:func:`encode_rows` of one row."""
    try:
        data: bytes = _msgspec_encode(value)
    except Exception:
        return _standard_bytes(value)
    if data.isascii() and b"\x7f" not in data and not _packs_a_float(value):
        return data
    return _standard_bytes(value)
