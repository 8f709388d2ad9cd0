"""The replication line grammar (``replication/protocol/commands.py``), no database.

Vectors from Synapse's ``tests/replication/tcp/test_commands.py``, byte-exact lines per command, round
trips, a corpus of malformed lines with the exact ``ERROR`` text each must produce, and
hypothesis fuzzing of ``parse_line``.
"""
from __future__ import annotations

import json
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.protocol.commands import (
    COMMANDS_BY_NAME,
    MAX_LINE_LENGTH,
    VALID_CLIENT_COMMANDS,
    VALID_SERVER_COMMANDS,
    CancelTaskCommand,
    ClearUserSyncCommand,
    Command,
    ErrorCommand,
    FederationAckCommand,
    LegacyPositionCommand,
    LegacyRdataCommand,
    LegacyReplicateCommand,
    LocalProtocolError,
    LockReleasedCommand,
    NameCommand,
    NewActiveTaskCommand,
    PingCommand,
    PositionCommand,
    ProtocolError,
    RdataCommand,
    RemoteProtocolError,
    RemoteServerUpCommand,
    ReplicateCommand,
    ServerCommand,
    UserIpCommand,
    UserSyncCommand,
    batch_updates,
    decode_json,
    encode_json,
    format_command,
    group_updates,
    parse_line,
)

EVENT_ROW = ["ev", ["$a:hs", "!r:hs", "m.room.member", "@u:hs", None, None, "join", False, False]]

# (command, its exact wire text): every command type at least once.
WIRE_LINES: list[tuple[Command, str]] = [
    (ServerCommand("example.com"), "SERVER example.com"),
    (
        RdataCommand("events", "master", 57, EVENT_ROW),
        'RDATA events master 57 ["ev",["$a:hs","!r:hs","m.room.member","@u:hs",null,null,"join",false,false]]',
    ),
    (
        RdataCommand("presence", "master", None, ["@foo:example.com", "online"]),
        'RDATA presence master batch ["@foo:example.com","online"]',
    ),
    (
        RdataCommand("caches", "w1", 7, ["get_user_by_id", None, 1490197670513]),
        'RDATA caches w1 7 ["get_user_by_id",null,1490197670513]',
    ),
    (RdataCommand("typing", "master", 3, {"a": [1, 2.5]}), 'RDATA typing master 3 {"a":[1,2.5]}'),
    (PositionCommand("caches", "worker1", 5, 9), "POSITION caches worker1 5 9"),
    (PositionCommand("events", "master", 53, 53), "POSITION events master 53 53"),
    (ErrorCommand("invalid command: RDATA"), "ERROR invalid command: RDATA"),
    (PingCommand("1490197665618"), "PING 1490197665618"),
    (NameCommand("synapse.app.generic_worker"), "NAME synapse.app.generic_worker"),
    (ReplicateCommand(), "REPLICATE "),
    (
        UserSyncCommand("abcde", "@u:hs", None, True, 1700000000000),
        "USER_SYNC abcde @u:hs None start 1700000000000",
    ),
    (UserSyncCommand("abcde", "@u:hs", "DEV", False, 1), "USER_SYNC abcde @u:hs DEV end 1"),
    (ClearUserSyncCommand("abcde"), "CLEAR_USER_SYNC abcde"),
    (FederationAckCommand("fed1", 12), "FEDERATION_ACK fed1 12"),
    (
        UserIpCommand("@u:hs", "tok", "1.2.3.4", "UA", None, 1700000000000),
        'USER_IP @u:hs ["tok","1.2.3.4","UA",null,1700000000000]',
    ),
    (
        UserIpCommand("@u:hs", "tok", "::1", "Mozilla/5.0 (X11)", "DEV", 5),
        'USER_IP @u:hs ["tok","::1","Mozilla/5.0 (X11)","DEV",5]',
    ),
    (RemoteServerUpCommand("matrix.org"), "REMOTE_SERVER_UP matrix.org"),
    (LockReleasedCommand("w1", "lock", "key"), 'LOCK_RELEASED ["w1","lock","key"]'),
    (NewActiveTaskCommand("abc123"), "NEW_ACTIVE_TASK abc123"),
    (CancelTaskCommand("abc123"), "CANCEL_TASK abc123"),
    (LegacyReplicateCommand("events", "53"), "REPLICATE events 53"),
    (LegacyReplicateCommand("ALL", "NOW"), "REPLICATE ALL NOW"),
]

# Only ever sent by our server; parse_line reads these names as the current generation.
LEGACY_SENT_ONLY: list[tuple[Command, str]] = [
    (
        LegacyRdataCommand("caches", None, ["get_user_by_id", ["@test:localhost:8823"], 1490197670513]),
        'RDATA caches batch ["get_user_by_id",["@test:localhost:8823"],1490197670513]',
    ),
    (LegacyRdataCommand("events", 54, ["$foo1:bar.com"]), 'RDATA events 54 ["$foo1:bar.com"]'),
    (LegacyPositionCommand("events", 53), "POSITION events 53"),
]


# --- Synapse's test_commands.py vectors ------------------------------------------------------------------------


def test_synapse_vector_replicate_without_body():
    assert parse_line("REPLICATE") == ReplicateCommand()


def test_synapse_vector_rdata_numeric_token():
    cmd = parse_line(
        'RDATA events master 6287863 ["ev", ["$eventid", "!roomid", "type", null, null, null]]'
    )
    assert isinstance(cmd, RdataCommand)
    assert (cmd.stream_name, cmd.instance_name, cmd.token) == ("events", "master", 6287863)
    assert cmd.row == ["ev", ["$eventid", "!roomid", "type", None, None, None]]


def test_synapse_vector_rdata_batch_token():
    cmd = parse_line('RDATA presence master batch ["@foo:example.com", "online"]')
    assert isinstance(cmd, RdataCommand)
    assert (cmd.stream_name, cmd.instance_name, cmd.token) == ("presence", "master", None)
    assert cmd.row == ["@foo:example.com", "online"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("POSITION caches worker1 5 9", PositionCommand("caches", "worker1", 5, 9)),
        (
            "USER_SYNC abcde @u:hs None start 1700000000000",
            UserSyncCommand("abcde", "@u:hs", None, True, 1700000000000),
        ),
        (
            'USER_IP @u:hs ["tok","1.2.3.4","UA",null,1700000000000]',
            UserIpCommand("@u:hs", "tok", "1.2.3.4", "UA", None, 1700000000000),
        ),
        ('LOCK_RELEASED ["w1","lock","key"]', LockReleasedCommand("w1", "lock", "key")),
        ("NEW_ACTIVE_TASK abc123", NewActiveTaskCommand("abc123")),
    ],
)
def test_extra_vectors_that_parse(line, expected):
    cmd = parse_line(line)
    assert cmd == expected
    assert type(cmd) is type(expected)


def test_extra_vector_field_types():
    sync = parse_line("USER_SYNC abcde @u:hs None start 1700000000000")
    assert sync.device_id is None and sync.is_syncing is True
    ip = parse_line('USER_IP @u:hs ["tok","1.2.3.4","UA",null,1700000000000]')
    assert ip.device_id is None and type(ip.last_seen) is int


@pytest.mark.parametrize(
    "line",
    [
        "POSITION caches worker1 5",
        "USER_SYNC abcde @u:hs DEV pause 1",
        "FEDERATION_ACK fed1 12 extra",
        "RDATA caches w1 7 [NaN]",
        "FOO bar",
    ],
)
def test_extra_vectors_that_fail(line):
    with pytest.raises(RemoteProtocolError) as info:
        parse_line(line)
    assert info.value.error_text.startswith("failed to parse line: ")


def test_extra_vectors_serialisation():
    assert format_command(ReplicateCommand()) == "REPLICATE "
    assert format_command(RdataCommand("s", "i", None, [])).split(" ")[3] == "batch"


def test_batching_vectors():
    updates = [(1, "a"), (1, "b"), (2, "c"), (3, "d"), (3, "e")]
    assert batch_updates(updates) == [(None, "a"), (1, "b"), (2, "c"), (None, "d"), (3, "e")]
    assert group_updates(updates) == [(1, ["a", "b"]), (2, ["c"]), (3, ["d", "e"])]
    assert group_updates([]) == []
    assert batch_updates([]) == []
    assert batch_updates([(4, "x")]) == [(4, "x")]


# --- exact lines and round trips ----------------------------------------------------------


@pytest.mark.parametrize(("cmd", "line"), WIRE_LINES + LEGACY_SENT_ONLY)
def test_exact_wire_text(cmd, line):
    assert cmd.to_line() == line
    assert format_command(cmd) == line


@pytest.mark.parametrize(("cmd", "line"), WIRE_LINES)
def test_round_trip(cmd, line):
    parsed = parse_line(format_command(cmd))
    assert parsed == cmd
    assert type(parsed) is type(cmd)


@pytest.mark.parametrize(("cmd", "line"), LEGACY_SENT_ONLY)
def test_legacy_sent_only_round_trip_through_their_class(cmd, line):
    name, _, body = line.partition(" ")
    assert type(cmd).from_body(body) == cmd
    # parse_line never produces them: the same name means the current generation.
    assert COMMANDS_BY_NAME[name] is not type(cmd)
    with pytest.raises(RemoteProtocolError):
        parse_line(line)  # three fields where the current generation wants four


def test_every_command_type_is_covered():
    covered = {type(cmd) for cmd, _ in WIRE_LINES + LEGACY_SENT_ONLY}
    assert set(COMMANDS_BY_NAME.values()) <= covered
    assert {LegacyReplicateCommand, LegacyRdataCommand, LegacyPositionCommand} <= covered


def test_command_table_and_allow_lists():
    assert set(COMMANDS_BY_NAME) == {
        "SERVER", "RDATA", "POSITION", "ERROR", "PING", "NAME", "REPLICATE", "USER_SYNC",
        "CLEAR_USER_SYNC", "FEDERATION_ACK", "USER_IP", "REMOTE_SERVER_UP", "LOCK_RELEASED",
        "NEW_ACTIVE_TASK", "CANCEL_TASK",
    }  # fmt: skip
    assert all(cls.NAME == name for name, cls in COMMANDS_BY_NAME.items())
    assert VALID_SERVER_COMMANDS == {
        "SERVER", "RDATA", "POSITION", "ERROR", "PING", "REMOTE_SERVER_UP", "LOCK_RELEASED",
    }  # fmt: skip
    assert VALID_CLIENT_COMMANDS == {
        "NAME", "REPLICATE", "PING", "USER_SYNC", "CLEAR_USER_SYNC", "FEDERATION_ACK",
        "USER_IP", "ERROR", "REMOTE_SERVER_UP", "LOCK_RELEASED",
    }  # fmt: skip
    both = VALID_SERVER_COMMANDS | VALID_CLIENT_COMMANDS
    assert "NEW_ACTIVE_TASK" not in both and "CANCEL_TASK" not in both
    assert both <= set(COMMANDS_BY_NAME)


# --- parsing details ----------------------------------------------------------------------


def test_name_is_text_before_first_space_and_body_may_be_empty():
    assert parse_line("PING") == PingCommand("")
    assert parse_line("PING ") == PingCommand("")
    assert parse_line("ERROR a  b ") == ErrorCommand("a  b ")
    assert parse_line("SERVER  example.com") == ServerCommand(" example.com")


def test_lines_are_not_stripped():
    assert parse_line("PING 123\r") == PingCommand("123\r")
    assert parse_line("NAME worker\r") == NameCommand("worker\r")
    # int() tolerates the surrounding whitespace, so a trailing \r is harmless there
    assert parse_line("POSITION s i 1 2\r") == PositionCommand("s", "i", 1, 2)
    with pytest.raises(RemoteProtocolError):
        parse_line(" PING 1")  # leading space: the name is ""


def test_integers_parse_like_int():
    assert parse_line("POSITION s i +5  6") == PositionCommand("s", "i", 5, 6)  # int(" 6")
    assert parse_line("RDATA s i -3 []").token == -3
    assert parse_line("FEDERATION_ACK fed1 1_000").token == 1000
    with pytest.raises(RemoteProtocolError, match="int"):
        parse_line("POSITION s i 1 2 3")  # int("2 3")


def test_rdata_row_json_may_contain_spaces_and_batch_is_case_sensitive():
    assert parse_line('RDATA s i 1 [ "a b" , 1 ]').row == ["a b", 1]
    with pytest.raises(RemoteProtocolError):
        parse_line("RDATA s i BATCH []")


def test_replicate_body_selects_generation():
    assert parse_line("REPLICATE ") == ReplicateCommand()
    assert parse_line("REPLICATE   ") == ReplicateCommand()
    assert parse_line("REPLICATE \r") == ReplicateCommand()
    assert ReplicateCommand.from_body("events 1") == ReplicateCommand()  # body ignored
    assert parse_line("REPLICATE events 53") == LegacyReplicateCommand("events", "53")
    assert parse_line("REPLICATE ALL NOW") == LegacyReplicateCommand("ALL", "NOW")
    assert parse_line("REPLICATE caches now") == LegacyReplicateCommand("caches", "NOW")
    assert parse_line("REPLICATE events NOW") == LegacyReplicateCommand("events", "NOW")


def test_modern_lines_with_legacy_names_are_read_as_modern():
    with pytest.raises(RemoteProtocolError):
        parse_line('RDATA events 54 ["$foo1:bar.com",1]')  # 3 fields: not the legacy form
    with pytest.raises(RemoteProtocolError):
        parse_line("POSITION events 53")


def test_user_ip_repr_hides_access_token():
    assert "secret" not in repr(UserIpCommand("@u:hs", "secret", "ip", "ua", None, 1))


# --- malformed lines, each with its error text --------------------------------------------

MALFORMED: list[tuple[str, str]] = [
    ("FOO bar", "failed to parse line: KeyError('FOO') ('FOO bar'):"),
    ("rdata s i 1 []", "failed to parse line: KeyError('rdata') ('rdata s i 1 []'):"),
    ("", "failed to parse line: KeyError('') (''):"),
    (
        "POSITION caches worker1 5",
        "failed to parse line: ValueError('not enough values to unpack (expected 4, got 3)') "
        "('POSITION caches worker1 5'):",
    ),
    (
        "RDATA events master 1",
        "failed to parse line: ValueError('not enough values to unpack (expected 4, got 3)') "
        "('RDATA events master 1'):",
    ),
    (
        "POSITION s i x 2",
        "failed to parse line: ValueError(\"invalid literal for int() with base 10: 'x'\") "
        "('POSITION s i x 2'):",
    ),
    (
        "RDATA caches w1 7 [NaN]",
        "failed to parse line: ValueError(\"Invalid JSON value: 'NaN'\") ('RDATA caches w1 7 [NaN]'):",
    ),
    (
        "RDATA caches w1 7 [Infinity]",
        "failed to parse line: ValueError(\"Invalid JSON value: 'Infinity'\") "
        "('RDATA caches w1 7 [Infinity]'):",
    ),
    (
        "RDATA caches w1 7 -Infinity",
        "failed to parse line: ValueError(\"Invalid JSON value: '-Infinity'\") "
        "('RDATA caches w1 7 -Infinity'):",
    ),
    (
        "RDATA caches w1 7 [1,",
        "failed to parse line: JSONDecodeError('Expecting value: line 1 column 4 (char 3)') "
        "('RDATA caches w1 7 [1,'):",
    ),
    (
        "USER_SYNC abcde @u:hs DEV pause 1",
        "failed to parse line: ValueError(\"Invalid USER_SYNC state 'pause'\") "
        "('USER_SYNC abcde @u:hs DEV pause 1'):",
    ),
    (
        "FEDERATION_ACK fed1 12 extra",
        "failed to parse line: ValueError('too many values to unpack (expected 2)') "
        "('FEDERATION_ACK fed1 12 extra'):",
    ),
    (
        'LOCK_RELEASED ["w1","lock"]',
        "failed to parse line: ValueError('LOCK_RELEASED payload must be a JSON array of 3 "
        "elements') ('LOCK_RELEASED [\"w1\",\"lock\"]'):",
    ),
    (
        'LOCK_RELEASED ["w1","lock","key","x"]',
        "failed to parse line: ValueError('LOCK_RELEASED payload must be a JSON array of 3 "
        "elements') ('LOCK_RELEASED [\"w1\",\"lock\",\"key\",\"x\"]'):",
    ),
    (
        'LOCK_RELEASED ["w1","lock",3]',
        "failed to parse line: TypeError('LOCK_RELEASED lock_key must be a string, not int') "
        "('LOCK_RELEASED [\"w1\",\"lock\",3]'):",
    ),
    (
        'USER_IP @u:hs ["tok","1.2.3.4","UA",null]',
        "failed to parse line: ValueError('USER_IP payload must be a JSON array of 5 "
        "elements') ('USER_IP @u:hs [\"tok\",\"1.2.3.4\",\"UA\",null]'):",
    ),
    (
        'USER_IP @u:hs ["tok","1.2.3.4","UA",null,"5"]',
        "failed to parse line: TypeError('USER_IP last_seen must be an integer') "
        "('USER_IP @u:hs [\"tok\",\"1.2.3.4\",\"UA\",null,\"5\"]'):",
    ),
    (
        "REPLICATE ALL 5",
        "failed to parse line: ValueError('REPLICATE ALL is only valid with the token NOW') "
        "('REPLICATE ALL 5'):",
    ),
    (
        "REPLICATE events soon",
        "failed to parse line: ValueError(\"REPLICATE token must be digits or NOW, not 'soon'\") "
        "('REPLICATE events soon'):",
    ),
    (
        "REPLICATE events",
        "failed to parse line: ValueError('not enough values to unpack (expected 2, got 1)') "
        "('REPLICATE events'):",
    ),
]


@pytest.mark.parametrize(("line", "error_text"), MALFORMED)
def test_malformed_line_error_text(line, error_text):
    with pytest.raises(RemoteProtocolError) as info:
        parse_line(line)
    assert info.value.error_text == error_text
    assert str(info.value) == error_text
    assert isinstance(info.value, ProtocolError)
    assert not isinstance(info.value, LocalProtocolError)


def test_error_text_quotes_are_cut_so_the_error_line_fits():
    line = "X" * MAX_LINE_LENGTH  # no space: the whole line is the (unknown) name
    with pytest.raises(RemoteProtocolError) as info:
        parse_line(line)
    text = info.value.error_text
    assert text.startswith("failed to parse line: KeyError('XXX") and text.endswith("...):")
    assert len(format_command(ErrorCommand(text)).encode()) < MAX_LINE_LENGTH


# --- sending-side checks ------------------------------------------------------------------


@pytest.mark.parametrize(
    "cmd",
    [
        PingCommand("a\nb"),
        ServerCommand("example.com\n"),
        RdataCommand("events\n", "master", 1, []),
        UserIpCommand("@u\n:hs", "t", "ip", "ua", None, 1),
    ],
)
def test_format_refuses_newlines(cmd):
    with pytest.raises(LocalProtocolError, match="newline"):
        format_command(cmd)


@pytest.mark.parametrize(
    "row",
    [[float("nan")], {"x": float("inf")}, [object()], {1j: 1}],
    ids=["nan", "inf", "object", "key"],
)
def test_format_refuses_values_json_cannot_carry(row):
    with pytest.raises(LocalProtocolError):
        format_command(RdataCommand("s", "i", 1, row))


# --- JSON ---------------------------------------------------------------------------------


def test_json_matches_synapse_encoder_byte_for_byte():
    # Synapse: json.JSONEncoder(allow_nan=False, separators=(",", ":")), ensure_ascii left on
    assert encode_json(["é", "☃", "😀"]) == '["\\u00e9","\\u2603","\\ud83d\\ude00"]'
    assert encode_json({"a": (1, None, True)}) == '{"a":[1,null,true]}'
    assert encode_json(types.MappingProxyType({"k": "v"})) == '{"k":"v"}'
    assert encode_json("line\nbreak") == '"line\\nbreak"'  # never a raw newline
    cmd = RdataCommand("s", "i", 1, ["café"])
    assert format_command(cmd) == 'RDATA s i 1 ["caf\\u00e9"]'
    assert parse_line(format_command(cmd)) == cmd


def test_json_decoding_accepts_raw_utf8_and_rejects_constants():
    assert decode_json('["café"]') == ["café"]
    for text in ("NaN", "[Infinity]", '{"a":-Infinity}'):
        with pytest.raises(ValueError, match="Invalid JSON value"):
            decode_json(text)
    assert decode_json("1e400") == float("inf")  # a number, not a constant: stdlib behaviour


# --- fuzzing ------------------------------------------------------------------------------

_names = st.sampled_from(sorted(COMMANDS_BY_NAME) + ["", "rdata", "FOO"])
_bodies = st.one_of(
    st.text(max_size=60),
    st.lists(
        st.text(alphabet="abc 123-+_.batchNoneALLNOWstartend[]{}\",:nul", max_size=12), max_size=6
    ).map(" ".join),
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=80), st.tuples(_names, _bodies).map(" ".join)))
def test_parse_line_only_ever_raises_remote_protocol_error(line):
    try:
        cmd = parse_line(line)
    except RemoteProtocolError as e:
        assert "\n" not in e.error_text
        assert len(format_command(ErrorCommand(e.error_text)).encode()) <= MAX_LINE_LENGTH
    else:
        assert isinstance(cmd, Command)
        assert cmd.NAME == line.partition(" ")[0]


_word = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=" \n"), max_size=12
)
_free_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n")
)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)
_ints = st.integers(min_value=-(2**63), max_value=2**63)
_commands = st.one_of(
    st.builds(ServerCommand, _free_text),
    st.builds(ErrorCommand, _free_text),
    st.builds(PingCommand, _free_text),
    st.builds(NameCommand, _free_text),
    st.builds(RemoteServerUpCommand, _free_text),
    st.builds(NewActiveTaskCommand, _free_text),
    st.builds(CancelTaskCommand, _free_text),
    st.builds(ClearUserSyncCommand, _free_text),
    st.builds(RdataCommand, _word, _word, st.none() | _ints, _json),
    st.builds(PositionCommand, _word, _word, _ints, _ints),
    st.builds(
        UserSyncCommand, _word, _word, st.none() | _word.filter(lambda d: d != "None"),
        st.booleans(), _ints,
    ),
    st.builds(FederationAckCommand, _word, _ints),
    st.builds(UserIpCommand, _word, st.text(), st.text(), st.text(), st.none() | st.text(), _ints),
    st.builds(LockReleasedCommand, st.text(), st.text(), st.text()),
    st.just(ReplicateCommand()),
    st.builds(
        LegacyReplicateCommand,
        _word.filter(lambda s: s not in ("", "ALL")),
        st.just("NOW") | st.integers(min_value=0).map(str),
    ),
)


# What Synapse's synapse/util/json.py builds; encode_json must match it byte for byte.
_SYNAPSE_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


@settings(max_examples=300, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=16,
))  # fmt: skip
def test_encode_json_matches_synapse_encoder(value):
    try:
        expected = _SYNAPSE_ENCODER.encode(value)
    except ValueError:  # NaN / Infinity
        with pytest.raises(ValueError):
            encode_json(value)
    else:
        assert encode_json(value) == expected


def _synapse_reject(name):
    raise ValueError("Invalid JSON value: '%s'" % name)


_SYNAPSE_DECODER = json.JSONDecoder(parse_constant=_synapse_reject)
_json_texts = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=' \t\r\n[]{}",:0123456789.-+eEtruefalsnNaIiy\\x', max_size=30),
    st.tuples(
        st.sampled_from(["", " ", "\n"]),
        _json.map(json.dumps),
        st.sampled_from(["", " ", "x", "]"]),
    ).map("".join),
)


@settings(max_examples=400, deadline=None)
@given(_json_texts)
def test_decode_json_matches_synapse_decoder(text):
    try:
        expected = _SYNAPSE_DECODER.decode(text)
    except ValueError as e:
        with pytest.raises(ValueError) as info:
            decode_json(text)
        assert repr(info.value) == repr(e)
    else:
        assert decode_json(text) == expected


@settings(max_examples=400, deadline=None)
@given(_commands)
def test_generated_commands_round_trip(cmd):
    line = format_command(cmd)
    assert line.startswith(cmd.NAME + " ")
    parsed = parse_line(line)
    assert parsed == cmd
    assert type(parsed) is type(cmd)


def test_parsed_rdata_is_the_same_frozen_value_as_a_constructed_one():
    """The parser fills RDATA's slots directly (hot path): the result must still be an
    ordinary RdataCommand: equal, hashable, immutable."""
    import dataclasses

    parsed = parse_line('RDATA receipts w1 7 ["!r:hs","m.read",{"ts":1}]')
    built = RdataCommand("receipts", "w1", 7, ["!r:hs", "m.read", {"ts": 1}])
    assert type(parsed) is RdataCommand
    assert parsed == built and repr(parsed) == repr(built)
    assert parse_line('RDATA receipts w1 batch [1]') == RdataCommand("receipts", "w1", None, [1])
    assert hash(parse_line("RDATA s w 3 1")) == hash(RdataCommand("s", "w", 3, 1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.token = 8  # type: ignore[misc]
