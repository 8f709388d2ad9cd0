"""The fast paths of the replication JSON (``replication/protocol/wire_json.py``): msgspec's
rows are the standard library's, value for value and byte for byte, or the same error.

Property tests (bounded, small values) over every class of character a row can carry, big
integers, floats of every form and nesting; examples for the cases the guards exist for.
"""
from __future__ import annotations

import math
import types

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replication.protocol import wire_json
from replication.protocol.commands import RdataRun, add_rdata_line, parse_line
from replication.protocol.line_batch import build_line_bytes, build_lines
from replication.protocol.wire_json import _encode, decode_json, decode_row, encode_rows

# --- values -------------------------------------------------------------------------------

#: One strategy per class of character: printable ASCII, control characters, U+007F,
#: non-ASCII of the BMP, non-BMP (a surrogate pair when escaped), lone surrogates.
_CHAR_CLASSES = {
    "ascii": st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    "control": st.characters(max_codepoint=0x1F),
    "del": st.just("\x7f"),
    "bmp": st.characters(min_codepoint=0x80, max_codepoint=0xFFFF, exclude_categories=("Cs",)),
    "astral": st.characters(min_codepoint=0x10000),
    "surrogate": st.characters(categories=("Cs",)),
}
_text = st.text(st.one_of(*_CHAR_CLASSES.values()), max_size=6)
_ints = st.one_of(
    st.integers(-1000, 1000),
    st.integers(-(2**70), 2**70),  # past 64 bits, where orjson gives up
    st.sampled_from([2**64, -(2**64) - 1, 2**63, 10**40, 0xCB, 0xCBCB, 2**200]),
)
_floats = st.one_of(
    st.floats(),  # NaN and the infinities included
    st.sampled_from([1e16, 1e-7, 1e22, 0.0001, -0.0, 5e-324, 1.7976931348623157e308, 123456789.125]),
)
_scalars = st.one_of(st.none(), st.booleans(), _ints, _floats, _text)
_values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=3)
    | st.tuples(children, children)
    | st.dictionaries(_text, children, max_size=3),
    max_leaves=8,
)


def _same(a: object, b: object) -> bool:
    """Equal and of the same types all the way down (1 == 1.0 == True and 0.0 == -0.0 are
    not the same row)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.isnan(a) and math.isnan(b) or repr(a) == repr(b)  # type: ignore[arg-type]
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)  # type: ignore[index, call-overload]
    return a == b


def _outcome(func, *args):
    try:
        return "value", func(*args)
    except Exception as e:
        return "error", f"{type(e).__name__}: {e}"


# --- decoding -----------------------------------------------------------------------------


def _json_bytes(value, ensure_ascii: bool, space: str) -> bytes:
    import json

    text = json.dumps(value, ensure_ascii=ensure_ascii, allow_nan=True, separators=("," + space, ":" + space))
    return text.encode("utf-8", "surrogatepass")  # lone surrogates raw: not UTF-8, refused


_numbers = st.from_regex(r"\A-?(0|[1-9][0-9]{0,30}|0[0-9])(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,3})?\Z")
_row_bytes = st.one_of(
    st.builds(_json_bytes, _values, st.booleans(), st.sampled_from(["", " ", "\t", "\r\n"])),
    _numbers.map(str.encode),
    st.sampled_from([b"NaN", b"[Infinity]", b'{"a":-Infinity}', b'"\\ud800"', b'["\\udc00\\ud800"]',
                     b'"\\ud83d\\ude00"', b"1e400", b"-1e400", b"9" * 4301, b"-" + b"9" * 4300, b'"\x7f"',
                     b'"\x01"', b"\xff", b'"\xed\xa0\x80"', b'"\xc3\xa9"', b"[1,]", b"01", b" [1] ", b"\x0c1",
                     b"[" * 990 + b"]" * 990, b"", b'{"a":1,"a":2}']),
    st.binary(max_size=12),
    st.text(' \t\r\n[]{}",:0123456789.-+eEtruefalsnNaIiy\\u', max_size=16).map(str.encode),
)


@settings(max_examples=300, deadline=None)
@given(_row_bytes)
@example(b"18446744073709551616")  # 2**64: orjson's float, an int here
def test_decode_row_gives_the_standard_decoders_value_or_error(data):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        expected = _outcome(data.decode, "utf-8")
    else:
        expected = _outcome(decode_json, text)
        got = _outcome(decode_row, text)  # text as well as bytes
        assert got[0] == expected[0] and (_same(got[1], expected[1]) if got[0] == "value" else got == expected)
    got = _outcome(decode_row, data)
    assert got[0] == expected[0], (data, got, expected)
    if got[0] == "value":
        assert _same(got[1], expected[1]), (data, got, expected)
    else:
        assert got == expected


_tokens = st.one_of(st.integers(-(2**63), 2**63).map(str), st.sampled_from(["batch", "BATCH", "\u0661\u0662",
                                                                           " 7", "1_0", "", "x", "\xe9"]))
_names = st.sampled_from(["receipts", "events", "caches", "w1", "w\xe9", "", "r\u0661"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_names, _names, _tokens, _row_bytes), min_size=1, max_size=3),
       st.sampled_from([b"", b"\r"]))
def test_rdata_lines_read_as_bytes_and_as_text_give_the_same_runs(fields, end):
    """The workers' hot path splits bytes; decoding the line first must come to the same."""
    from_bytes: list = []
    from_text: list = []
    for stream, writer, token, row in fields:
        line = b"RDATA %s %s %s %s%s" % (stream.encode(), writer.encode(), token.encode(), row, end)
        took = add_rdata_line(from_bytes, line)
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            assert not took
            continue
        assert took == add_rdata_line(from_text, text)
        if took:  # and what parse_line reads from the same line
            cmd = parse_line(text)
            entry = from_bytes[-1].entries[-1]
            assert (cmd.stream_name, cmd.instance_name, cmd.token) == (stream, writer, entry[0])
            assert _same(cmd.row, entry[1])
    assert len(from_bytes) == len(from_text)
    for a, b in zip(from_bytes, from_text):
        assert type(a) is RdataRun and (a.stream_name, a.instance_name) == (b.stream_name, b.instance_name)
        assert [t for t, _ in a.entries] == [t for t, _ in b.entries]
        assert all(_same(x, y) for (_, x), (_, y) in zip(a.entries, b.entries))


# --- encoding -----------------------------------------------------------------------------


def _standard(rows):
    return [_encode(row).encode() for row in rows]


@settings(max_examples=300, deadline=None)
@given(st.lists(_values, min_size=1, max_size=4))
def test_encode_rows_is_the_standard_encoders_bytes_or_error(rows):
    expected = _outcome(_standard, rows)
    got = _outcome(encode_rows, rows)
    assert got == expected


@pytest.mark.parametrize("name", sorted(_CHAR_CLASSES))
def test_every_class_of_character_encodes_as_the_standard_library_does(name):
    text = {"ascii": "a~ ", "control": "\x00\x1f\n\t", "del": "\x7f", "bmp": "\xe9\u2603\uffff",
            "astral": "\U0001f600", "surrogate": "\ud800\udfff"}[name]
    rows = [["plain"], [text], {"k" + text: text}, ["plain", 1]]
    assert encode_rows(rows) == _standard(rows)
    assert encode_rows(rows)[0] == b'["plain"]'  # the other rows keep msgspec's bytes


def test_floats_take_the_standard_encoder_and_integers_that_look_like_floats_do_not_change():
    # 0xCB (float64's marker in msgpack) as an integer's byte and a string's length: only a
    # slower path, the same bytes
    rows = [["x", 0xCB], ["x" * 0xCB], ["t", 0xCBCBCBCBCB], [1e16], [1.5], [{"f": 1e-7}], ["y", 1]] * 3
    assert encode_rows(rows) == _standard(rows)
    assert _standard([[1e16]]) == [b"[1e+16]"]  # where msgspec writes 1e16
    rows = [["a", i] for i in range(200)] + [[float("nan")]] + [["b\xe9"]]
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        encode_rows(rows)


def test_the_first_row_the_standard_encoder_refuses_raises():
    rows = [["\xe9"], [float("inf")], [{1, 2}], [float("nan")]]
    assert _outcome(encode_rows, rows) == _outcome(_standard, rows)
    rows = [["ok"], [object()], [float("nan")]]
    assert _outcome(encode_rows, rows) == _outcome(_standard, rows)


def test_read_only_mappings_and_big_integers_encode_as_the_standard_library_does():
    rows = [types.MappingProxyType({"k": ("v", 2**70)}), [2**64, -(2**64)], (1, None, True)]
    assert encode_rows(rows) == _standard(rows) == [b'{"k":["v",1180591620717411303424]}',
                                                    b"[18446744073709551616,-18446744073709551616]",
                                                    b"[1,null,true]"]


def test_lines_are_the_same_with_the_fast_paths_off():
    facts = [(5, [["\xe9", 1.5]]), (6, [["a"], ["b", 2**65]]), (7, [{"x": None}])]
    fast = build_line_bytes("receipts", "w1", 4, 9, facts)
    wire_json.use_fast_paths(False)
    try:
        assert build_line_bytes("receipts", "w1", 4, 9, facts) == fast
        assert decode_row(b'[1,"\\u00e9"]') == [1, "\xe9"]
    finally:
        wire_json.use_fast_paths(True)
    assert build_lines("receipts", "w1", 4, 9, facts) == [line.decode() for line in fast]
    assert fast[-1] == b"POSITION receipts w1 7 9"
