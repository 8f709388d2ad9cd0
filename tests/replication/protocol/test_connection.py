"""The sans-I/O connection (``replication/protocol/connection.py``), no sockets, no database.

A :class:`ConnectionPair` joins a client and a server in memory; a fake clock (plain floats)
drives the keepalive decisions.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replication.protocol.commands import (
    Command,
    ErrorCommand,
    LegacyPositionCommand,
    LegacyRdataCommand,
    LegacyReplicateCommand,
    LocalProtocolError,
    LockReleasedCommand,
    NameCommand,
    NewActiveTaskCommand,
    PingCommand,
    PositionCommand,
    RdataCommand,
    RdataRun,
    RemoteProtocolError,
    RemoteServerUpCommand,
    ReplicateCommand,
    ServerCommand,
    UserSyncCommand,
    batch_updates,
)
from replication.protocol.connection import (
    CLOSED,
    NEED_DATA,
    PING_INTERVAL,
    PING_TIMEOUT,
    ReplicationConnection,
)


class ConnectionPair:
    """A client and a server connection joined in memory, with a shared fake clock."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.client = ReplicationConnection("client", now=now)
        self.server = ReplicationConnection("server", now=now)
        self.wire: list[tuple[str, bytes]] = []  # (sender role, bytes) in order

    def peer(self, conn: ReplicationConnection) -> ReplicationConnection:
        return self.server if conn is self.client else self.client

    def send(self, conn: ReplicationConnection, *cmds: Command) -> bytes:
        data = conn.send_many(cmds, self.now)
        self.wire.append((conn.our_role, data))
        self.peer(conn).receive_data(data)
        return data

    def receive(self, conn: ReplicationConnection) -> list[Command]:
        """Every command waiting at ``conn``."""
        events = []
        while True:
            event = conn.next_event(self.now)
            if event is NEED_DATA or event is CLOSED:
                return events
            events.append(event)


def drain(conn: ReplicationConnection, now: float = 0.0) -> list[object]:
    """Every event up to and including the first NEED_DATA or CLOSED."""
    events: list[object] = []
    while True:
        event = conn.next_event(now)
        events.append(event)
        if event is NEED_DATA or event is CLOSED:
            return events


def remote_error(conn: ReplicationConnection, now: float = 0.0) -> str:
    with pytest.raises(RemoteProtocolError) as info:
        drain(conn, now)
    return info.value.error_text


# --- the handshake over an in-memory pair -------------------------------------------------

ROW_A = ["get_user_by_id", ["@a:hs"], 1490197670513]
ROW_B = ["get_user_by_id", ["@b:hs"], 1490197670513]


def test_handshake_transcript():
    pair = ConnectionPair()
    client, server = pair.client, pair.server

    pair.send(server, ServerCommand("localhost:8823"), PingCommand("1490197665618"))
    pair.send(client, NameCommand("worker1"), PingCommand("1490197665618"), ReplicateCommand())
    assert pair.receive(client) == [ServerCommand("localhost:8823"), PingCommand("1490197665618")]
    assert pair.receive(server) == [
        NameCommand("worker1"),
        PingCommand("1490197665618"),
        ReplicateCommand(),
    ]

    rdata = [
        RdataCommand("caches", "master", token, row)
        for token, row in batch_updates([(2, ROW_A), (2, ROW_B)])
    ]
    pair.send(
        server,
        PositionCommand("events", "master", 1, 1),
        PositionCommand("caches", "master", 1, 1),
    )
    pair.send(server, *rdata)
    assert pair.receive(client) == [
        PositionCommand("events", "master", 1, 1),
        PositionCommand("caches", "master", 1, 1),
        RdataCommand("caches", "master", None, ROW_A),
        RdataCommand("caches", "master", 2, ROW_B),
    ]
    assert pair.wire == [
        ("server", b"SERVER localhost:8823\nPING 1490197665618\n"),
        ("client", b"NAME worker1\nPING 1490197665618\nREPLICATE \n"),
        ("server", b"POSITION events master 1 1\nPOSITION caches master 1 1\n"),
        (
            "server",
            b'RDATA caches master batch ["get_user_by_id",["@a:hs"],1490197670513]\n'
            b'RDATA caches master 2 ["get_user_by_id",["@b:hs"],1490197670513]\n',
        ),
    ]
    assert client.peer_sends_pings and server.peer_sends_pings


def test_legacy_client_handshake():
    pair = ConnectionPair()
    pair.send(pair.client, NameCommand("old"), LegacyReplicateCommand("ALL", "NOW"))
    assert pair.receive(pair.server) == [NameCommand("old"), LegacyReplicateCommand("ALL", "NOW")]
    data = pair.send(
        pair.server,
        LegacyPositionCommand("events", 53),
        LegacyRdataCommand("events", 54, ["$foo1:bar.com"]),
    )
    assert data == b'POSITION events 53\nRDATA events 54 ["$foo1:bar.com"]\n'


def test_roles():
    server = ReplicationConnection("server", now=0)
    client = ReplicationConnection("client", now=0)
    assert (server.our_role, server.their_role) == ("server", "client")
    assert (client.our_role, client.their_role) == ("client", "server")
    with pytest.raises(ValueError):
        ReplicationConnection("master", now=0)


# --- framing ------------------------------------------------------------------------------

TRANSCRIPT = (
    b"SERVER example.com\n"
    b"PING 1490197665618\n"
    b"\n"
    b"   \t\n"
    b'RDATA events master batch ["$a:hs","caf\xc3\xa9 \xe2\x98\x83"]\n'
    b'RDATA events master 57 ["ev",["$a:hs","!r:hs","m.room.member","@u:hs",null,null,"join",false,false]]\n'
    b"POSITION caches master 5 9\n"
    b'LOCK_RELEASED ["w1","lock","key"]\n'
    b"REMOTE_SERVER_UP matrix.org\n"
)
TRANSCRIPT_COMMANDS = [
    ServerCommand("example.com"),
    PingCommand("1490197665618"),
    RdataCommand("events", "master", None, ["$a:hs", "café ☃"]),
    RdataCommand(
        "events", "master", 57,
        ["ev", ["$a:hs", "!r:hs", "m.room.member", "@u:hs", None, None, "join", False, False]],
    ),
    PositionCommand("caches", "master", 5, 9),
    LockReleasedCommand("w1", "lock", "key"),
    RemoteServerUpCommand("matrix.org"),
]  # fmt: skip


def test_transcript_in_one_piece_then_eof():
    client = ReplicationConnection("client", now=0)
    client.receive_data(TRANSCRIPT)
    assert drain(client) == TRANSCRIPT_COMMANDS + [NEED_DATA]
    client.receive_data(b"")
    assert client.next_event(0) is CLOSED
    assert client.next_event(0) is CLOSED


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(TRANSCRIPT)), max_size=12))
def test_any_split_yields_the_same_commands(cuts):
    bounds = [0, *sorted(cuts), len(TRANSCRIPT)]
    client = ReplicationConnection("client", now=0)
    events: list[object] = []
    for start, end in zip(bounds, bounds[1:]):
        if end > start:
            client.receive_data(TRANSCRIPT[start:end])
        events.extend(e for e in drain(client) if e is not NEED_DATA)
    client.receive_data(b"")
    events.extend(drain(client))
    assert events == TRANSCRIPT_COMMANDS + [CLOSED]


def test_byte_at_a_time():
    client = ReplicationConnection("client", now=0)
    events = []
    for i in range(len(TRANSCRIPT)):
        client.receive_data(TRANSCRIPT[i : i + 1])
        events.extend(e for e in drain(client) if e is not NEED_DATA)
    assert events == TRANSCRIPT_COMMANDS


def test_lf_framing_keeps_carriage_returns():
    client = ReplicationConnection("client", now=0)
    client.receive_data(b"PING 1\r\n\r\nPOSITION s m 1 2\r\nSERVER hs\r\n")
    assert drain(client) == [
        PingCommand("1\r"),  # the \r stays in the last field
        PositionCommand("s", "m", 1, 2),  # int() tolerates it; the blank "\r" line is skipped
        ServerCommand("hs\r"),
        NEED_DATA,
    ]


def test_unterminated_data_at_eof_is_dropped():
    client = ReplicationConnection("client", now=0)
    client.receive_data(b"PING 1\nPING 2")
    client.receive_data(b"")
    assert drain(client) == [PingCommand("1"), CLOSED]


def test_data_after_eof_is_a_local_error():
    client = ReplicationConnection("client", now=0)
    client.receive_data(b"")
    client.receive_data(b"")  # repeating EOF is harmless
    with pytest.raises(LocalProtocolError):
        client.receive_data(b"PING 1\n")


def test_line_length_limit_is_inclusive():
    conn = ReplicationConnection("client", now=0, max_line_length=20)
    conn.receive_data(b"PING " + b"x" * 15 + b"\n")  # exactly 20 bytes
    assert drain(conn) == [PingCommand("x" * 15), NEED_DATA]
    conn.receive_data(b"PING " + b"x" * 16 + b"\nPING after\n")
    assert remote_error(conn) == "Line length exceeded"


def test_long_unterminated_buffer_fails_after_the_lines_before_it():
    conn = ReplicationConnection("client", now=0, max_line_length=20)
    conn.receive_data(b"PING 1\nPING " + b"x" * 15)  # partial of exactly 20: still fine
    assert drain(conn) == [PingCommand("1"), NEED_DATA]
    conn.receive_data(b"x")
    assert remote_error(conn) == "Line length exceeded"
    conn.receive_data(b"\n" * 5)  # ignored, the connection is condemned
    assert remote_error(conn) == "Line length exceeded"


def test_default_line_length_is_16384_bytes():
    conn = ReplicationConnection("client", now=0)
    conn.receive_data(b"PING " + b"x" * (16384 - 5) + b"\n")
    assert drain(conn)[0] == PingCommand("x" * (16384 - 5))
    conn.receive_data(b"x" * 16385)
    assert remote_error(conn) == "Line length exceeded"


def test_blank_lines_over_the_limit_still_count():
    conn = ReplicationConnection("client", now=0, max_line_length=10)
    conn.receive_data(b" " * 11 + b"\n")
    assert remote_error(conn) == "Line length exceeded"


def test_invalid_utf8_is_a_parse_error():
    conn = ReplicationConnection("client", now=0)
    conn.receive_data(b"PING \xff\xfe\n")
    text = remote_error(conn)
    assert text.startswith("failed to parse line: UnicodeDecodeError('utf-8', b'PING \\xff\\xfe'")
    assert text.endswith("(b'PING \\xff\\xfe'):")


def test_parse_error_text_and_errors_are_sticky():
    conn = ReplicationConnection("server", now=0)
    conn.receive_data(b"NAME w\nFOO bar\nPING 1\n")
    assert conn.next_event(0) == NameCommand("w")
    expected = "failed to parse line: KeyError('FOO') ('FOO bar'):"
    assert remote_error(conn) == expected
    assert remote_error(conn) == expected  # the PING after it is never delivered
    # we can still answer with the error before closing
    assert conn.send(ErrorCommand(expected), 0) == b"ERROR " + expected.encode() + b"\n"


# --- direction ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("our_role", "line", "name"),
    [
        ("server", b'RDATA events master 1 ["x"]\n', "RDATA"),
        ("server", b"POSITION events master 1 1\n", "POSITION"),
        ("server", b"SERVER hs\n", "SERVER"),
        ("server", b"NEW_ACTIVE_TASK abc\n", "NEW_ACTIVE_TASK"),
        ("client", b"REPLICATE \n", "REPLICATE"),
        ("client", b"REPLICATE ALL NOW\n", "REPLICATE"),
        ("client", b"NAME w\n", "NAME"),
        ("client", b"USER_SYNC abcde @u:hs None start 1\n", "USER_SYNC"),
        ("client", b"CANCEL_TASK abc\n", "CANCEL_TASK"),
    ],
)
def test_receiving_a_command_the_peer_may_not_send(our_role, line, name):
    conn = ReplicationConnection(our_role, now=0)
    conn.receive_data(line)
    assert remote_error(conn, now=50) == f"invalid command: {name}"
    assert conn.last_received == 0  # an invalid command does not count as received


@pytest.mark.parametrize(
    ("our_role", "cmd"),
    [
        ("client", RdataCommand("events", "w", 1, [])),
        ("client", ServerCommand("hs")),
        ("client", LegacyPositionCommand("events", 1)),
        ("client", NewActiveTaskCommand("abc")),
        ("server", ReplicateCommand()),
        ("server", NameCommand("main")),
        ("server", UserSyncCommand("abcde", "@u:hs", None, True, 1)),
        ("server", NewActiveTaskCommand("abc")),
    ],
)
def test_sending_a_command_our_role_may_not_send(our_role, cmd):
    conn = ReplicationConnection(our_role, now=0)
    with pytest.raises(LocalProtocolError, match=cmd.NAME):
        conn.send(cmd, 1)
    with pytest.raises(LocalProtocolError):
        conn.send_many([PingCommand("1"), cmd], 1)
    assert conn.last_sent == 0


def test_both_sides_may_send_the_shared_commands():
    pair = ConnectionPair()
    shared = [
        PingCommand("1"),
        ErrorCommand("oops"),
        RemoteServerUpCommand("matrix.org"),
        LockReleasedCommand("w1", "lock", "key"),
    ]
    for conn in (pair.client, pair.server):
        pair.send(conn, *shared)
        assert pair.receive(pair.peer(conn)) == shared


# --- sending ------------------------------------------------------------------------------


def test_send_returns_the_line_with_its_newline():
    server = ReplicationConnection("server", now=0)
    position = PositionCommand("events", "master", 53, 53)
    assert server.send(position, 1) == b"POSITION events master 53 53\n"
    assert server.send(RdataCommand("s", "m", 1, ["é"]), 1) == b'RDATA s m 1 ["\\u00e9"]\n'


def test_send_many_is_the_concatenation_of_send():
    cmds = [RdataCommand("events", "master", t, ["row", t]) for t in (None, 5, None, None, 6)]
    server = ReplicationConnection("server", now=0)
    one_by_one = b"".join(server.send(c, 0) for c in cmds)
    assert server.send_many(cmds, 0) == one_by_one
    assert server.send_many(iter(cmds), 0) == one_by_one
    assert server.send_many([], 7) == b""
    assert server.last_sent == 0  # nothing was sent


@pytest.mark.parametrize(
    "cmd", [PingCommand("a\nb"), RdataCommand("s", "m", 1, [float("nan")]), PingCommand("\ud800")]
)
def test_send_refuses_invalid_commands(cmd):
    server = ReplicationConnection("server", now=0)
    with pytest.raises(LocalProtocolError):
        server.send(cmd, 1)
    with pytest.raises(LocalProtocolError):
        server.send_many([PingCommand("ok"), cmd], 1)
    assert server.last_sent == 0


def test_send_enforces_the_line_length_in_bytes():
    server = ReplicationConnection("server", now=0, max_line_length=20)
    assert server.send(PingCommand("x" * 15), 0) == b"PING " + b"x" * 15 + b"\n"
    with pytest.raises(LocalProtocolError, match="too long"):
        server.send(PingCommand("x" * 16), 0)
    # 15 characters but 30 bytes
    with pytest.raises(LocalProtocolError, match="too long"):
        server.send(PingCommand("é" * 15), 0)
    with pytest.raises(LocalProtocolError, match="too long"):
        server.send_many([PingCommand("é" * 15)], 0)
    assert server.send_many([PingCommand("é" * 7)], 0) == ("PING " + "é" * 7 + "\n").encode()


def test_default_send_limit():
    server = ReplicationConnection("server", now=0)
    server.send(PingCommand("x" * (16384 - 5)), 0)
    with pytest.raises(LocalProtocolError):
        server.send(PingCommand("x" * (16384 - 4)), 0)


# --- keepalive decisions with a fake clock ------------------------------------------------


def test_ping_due_after_five_seconds_without_sending():
    conn = ReplicationConnection("client", now=100.0)
    assert not conn.ping_due(104.9)
    assert conn.ping_due(100.0 + PING_INTERVAL)
    conn.send(PingCommand("105000"), 105.0)
    assert not conn.ping_due(109.9)
    conn.send_many([ReplicateCommand()], 108.0)  # any command counts, not only PING
    assert not conn.ping_due(112.9)
    assert conn.ping_due(113.0)


def test_no_timeout_until_the_peer_has_pinged():
    conn = ReplicationConnection("server", now=0.0)
    assert not conn.timed_out(1000.0)
    conn.receive_data(b"NAME netcat-user\n")
    conn.next_event(10.0)
    assert not conn.timed_out(1000.0)
    assert not conn.peer_sends_pings


def test_timeout_after_twenty_five_seconds_of_silence():
    conn = ReplicationConnection("server", now=0.0)
    conn.receive_data(b"PING 1\n")
    conn.next_event(10.0)
    assert conn.peer_sends_pings and conn.last_received == 10.0
    assert not conn.timed_out(10.0 + PING_TIMEOUT)  # strictly more than 25 s
    assert conn.timed_out(10.0 + PING_TIMEOUT + 0.001)
    conn.receive_data(b"USER_SYNC abcde @u:hs None start 1\n")  # any valid command resets it
    conn.next_event(30.0)
    assert not conn.timed_out(55.0)
    assert conn.timed_out(55.5)


def test_receiving_without_taking_the_command_does_not_reset_the_clock():
    conn = ReplicationConnection("server", now=0.0)
    conn.receive_data(b"PING 1\n")
    assert conn.next_event(1.0) == PingCommand("1")
    conn.receive_data(b"PING 2\n")  # bytes arrived, but nobody parsed them yet
    assert conn.timed_out(27.0)


# --- fuzzing ------------------------------------------------------------------------------

_line_bits = st.sampled_from(
    [b"PING 1", b"NAME w", b"REPLICATE ", b"RDATA s m 1 []", b"SERVER hs", b"FOO", b"\xff",
     b"\r", b" ", b"\n", b"\n\n", b"x" * 40, b"USER_SYNC a b None end 1", b"[NaN]"]
)  # fmt: skip
_chunks = st.lists(
    st.one_of(
        st.binary(min_size=1, max_size=30),
        st.lists(_line_bits, min_size=1, max_size=5).map(b"".join),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["server", "client"]), _chunks, st.booleans())
def test_arbitrary_bytes_only_ever_raise_remote_protocol_error(role, chunks, eof):
    conn = ReplicationConnection(role, now=0, max_line_length=64)
    error = None
    for chunk in chunks:
        conn.receive_data(chunk)  # never raises
        try:
            drain(conn)
        except RemoteProtocolError as e:
            error = e.error_text
            break
    if eof:
        conn.receive_data(b"")
    try:
        events = drain(conn)
    except RemoteProtocolError as e:
        assert error is None or e.error_text == error  # sticky
        # the answer always fits in one ERROR line at the default limit
        ReplicationConnection(role, now=0).send(ErrorCommand(e.error_text), 1)
    else:
        assert error is None
        assert events[-1] is (CLOSED if eof else NEED_DATA)


# --- next_events: a chunk's commands at once (the worker's hot path) -----------------------


def _outcomes_one_by_one(conn: ReplicationConnection) -> tuple[list[object], str | None]:
    events: list[object] = []
    try:
        while (event := conn.next_event(0)) is not NEED_DATA and event is not CLOSED:
            events.append(event)
    except RemoteProtocolError as e:
        return events, e.error_text
    return events, None


def _outcomes_batched(conn: ReplicationConnection) -> tuple[list[object], str | None]:
    events: list[object] = []
    try:
        while batch := conn.next_events(0):
            events.extend(batch)
        conn.next_event(0)  # what is left to tell: NEED_DATA, CLOSED or the error
    except RemoteProtocolError as e:
        return events, e.error_text
    return events, None


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["server", "client"]), _chunks, st.booleans())
def test_next_events_gives_what_next_event_gives(role, chunks, eof):
    """The same commands in the same order, and the same error after the last good one."""
    one = ReplicationConnection(role, now=0, max_line_length=64)
    many = ReplicationConnection(role, now=0, max_line_length=64)
    seen_one: list[object] = []
    seen_many: list[object] = []
    for chunk in [*chunks, *([b""] if eof else [])]:
        one.receive_data(chunk)
        many.receive_data(chunk)
        events, error_one = _outcomes_one_by_one(one)
        seen_one += events
        events, error_many = _outcomes_batched(many)
        seen_many += events
        assert seen_many == seen_one
        assert error_many == error_one
        if error_one is not None:
            break


def test_next_events_returns_the_commands_before_a_bad_line_then_raises():
    conn = ReplicationConnection("client", now=0)
    conn.receive_data(b"PING 1\nPOSITION events w1 1 2\nBOGUS x\nPING 2\n")
    assert conn.next_events(7.0) == [PingCommand("1"), PositionCommand("events", "w1", 1, 2)]
    assert conn.peer_sends_pings and conn.last_received == 7.0
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_events(8.0)
    assert "BOGUS" in info.value.error_text
    assert conn.last_received == 7.0  # the bad line was not taken
    with pytest.raises(RemoteProtocolError):
        conn.next_event(9.0)  # sticky, as for next_event


def test_next_events_refuses_what_the_peer_may_not_send():
    conn = ReplicationConnection("server", now=0)
    conn.receive_data(b"NAME w\nRDATA events m 1 []\n")
    assert conn.next_events(0) == [NameCommand("w")]
    with pytest.raises(RemoteProtocolError, match="invalid command: RDATA"):
        conn.next_events(0)


# --- next_batch: RDATA in runs (the worker's hot path) -------------------------------------

_rdata_bits = st.sampled_from(
    [b"RDATA s m 1 []", b"RDATA s m batch [1]", b"RDATA s m 2 {\"a\": [1, 2]}", b"RDATA s m2 3 null",
     b"RDATA t m 4 \"x y\"", b"RDATA s m x []", b"RDATA s m 1", b"RDATA s m 1 [1] x", b"RDATA s m 1 NaN",
     b"RDATA s m  1 []", b"RDATA s m 1 [] ", b"RDATA s m -5 [1]", b"RDATA s m +5 [1]", b"RDATA s m 1_0 [1]",
     b"RDATA s m 1 \xff", b"RDATA s m 1 [\"\xc3\xa9\"]", b"RDATA s m 1 [\r", b"POSITION s m 1 2", b"PING 1",
     b"RDATA s m 7 " + b"[" * 30 + b"]" * 30, b"NAME w", b"\n", b"\n\n"]
)  # fmt: skip
_rdata_chunks = st.lists(
    st.one_of(st.binary(min_size=1, max_size=10), st.lists(_rdata_bits, min_size=1, max_size=6).map(b"\n".join)),
    max_size=12,
)


def _expanded(events: list[object]) -> list[object]:
    out: list[object] = []
    for event in events:
        out += event.commands() if isinstance(event, RdataRun) else [event]
    return out


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["server", "client"]), _rdata_chunks, st.booleans())
def test_next_batch_gives_what_next_events_gives(role, chunks, eof):
    """The same commands (runs expanded) in the same order, the same error after the last good
    one, and the same clock."""
    one = ReplicationConnection(role, now=0, max_line_length=64)
    runs = ReplicationConnection(role, now=0, max_line_length=64)
    seen_one: list[object] = []
    seen_runs: list[object] = []
    for i, chunk in enumerate([*chunks, *([b""] if eof else [])]):
        one.receive_data(chunk)
        runs.receive_data(chunk)
        error_one = error_runs = None
        try:
            while batch := one.next_events(i):
                seen_one += batch
            one.next_event(i)
        except RemoteProtocolError as e:
            error_one = e.error_text
        try:
            while batch := runs.next_batch(i):
                assert all(type(event) is not RdataCommand for event in batch)  # all in runs
                seen_runs += _expanded(batch)
            runs.next_event(i)
        except RemoteProtocolError as e:
            error_runs = e.error_text
        assert seen_runs == seen_one
        assert error_runs == error_one
        assert (runs.last_received, runs.peer_sends_pings) == (one.last_received, one.peer_sends_pings)
        if error_one is not None:
            break


def test_next_batch_gathers_rdata_per_stream_and_writer():
    conn = ReplicationConnection("client", now=0)
    conn.receive_data(b"RDATA s m batch [1]\nRDATA s m 1 [2]\nRDATA s m 2 [3]\nRDATA s m2 5 [4]\n"
                      b"POSITION s m 2 3\nRDATA s m 4 [5]\nRDATA t m 9 {}\n")
    assert conn.next_batch(1.0) == [
        RdataRun("s", "m", [(None, [1]), (1, [2]), (2, [3])]),
        RdataRun("s", "m2", [(5, [4])]),
        PositionCommand("s", "m", 2, 3),
        RdataRun("s", "m", [(4, [5])]),
        RdataRun("t", "m", [(9, {})]),
    ]
    assert conn.last_received == 1.0


def test_next_batch_keeps_the_runs_before_a_bad_line_then_raises():
    conn = ReplicationConnection("client", now=0)
    conn.receive_data(b"RDATA s m 1 [1]\nRDATA s m 2 [NaN]\nRDATA s m 3 [3]\n")
    assert conn.next_batch(0) == [RdataRun("s", "m", [(1, [1])])]
    with pytest.raises(RemoteProtocolError, match="NaN"):
        conn.next_batch(0)


def test_next_batch_refuses_rdata_from_a_client():
    conn = ReplicationConnection("server", now=0)
    conn.receive_data(b"NAME w\nRDATA events m 1 []\n")
    assert conn.next_batch(0) == [NameCommand("w")]
    with pytest.raises(RemoteProtocolError, match="invalid command: RDATA"):
        conn.next_batch(0)


# --- deadlines against squatters --------------------------------------------------------


def test_handshake_deadline_until_a_replicate_arrives():
    conn = ReplicationConnection("server", now=100.0, handshake_timeout=10.0)
    conn.receive_data(b"NAME squatter\nPING 1\n", 101.0)
    assert [conn.next_event(101.0), conn.next_event(101.0)] and conn.next_event(101.0) is NEED_DATA
    assert not conn.handshake_overdue(110.0) and conn.handshake_overdue(110.5)
    conn.receive_data(b"REPLICATE \n", 110.2)
    conn.next_event(110.2)
    assert conn.handshake_done and not conn.handshake_overdue(1000.0)
    # A legacy subscription is a handshake too; a client never has a deadline by default.
    legacy = ReplicationConnection("server", now=0.0, handshake_timeout=1.0)
    legacy.receive_data(b"REPLICATE receipts 0\n", 0.5)
    legacy.next_event(0.5)
    assert not legacy.handshake_overdue(5.0)
    assert not ReplicationConnection("client", now=0.0).handshake_overdue(1e9)


def test_a_partial_line_has_a_deadline_from_its_first_byte():
    conn = ReplicationConnection("server", now=0.0, line_timeout=5.0)
    assert not conn.line_overdue(100.0)  # nothing pending
    for t in range(6):  # a byte a second: the line began at 10
        conn.receive_data(b"PING 1"[t:t + 1], 10.0 + t)
    assert not conn.line_overdue(15.0) and conn.line_overdue(15.5)
    conn.receive_data(b"\nREP", 15.2)  # the line ended; a new one began now
    assert conn.next_event(15.2) == PingCommand("1")
    assert not conn.line_overdue(20.0) and conn.line_overdue(20.3)
    conn.receive_data(b"LICATE \n", 20.25)
    conn.next_event(20.25)
    assert not conn.line_overdue(1e9)  # nothing unterminated


def test_no_partial_line_deadline_without_a_clock():
    conn = ReplicationConnection("server", now=0.0, line_timeout=1.0)
    conn.receive_data(b"PIN")  # the worker's own reads pass no time
    assert not conn.line_overdue(1e9)
