"""Replication wire commands: the line grammar of docs/replication.md, sans I/O.

Every command travels as one line of UTF-8 text, ``NAME + " " + body`` (the space is sent
even when the body is empty), without the newline that frames it on TCP. This module owns
the whole grammar: one frozen dataclass per command (its docstring shows the format and one
example line), :func:`parse_line` for text from a peer, :func:`format_command` for text to a
peer, the "who may send what" allow-lists, and the JSON and batching rules shared by all of
them. It reads no clock and touches no socket; framing, direction checks and keepalive
decisions live in :mod:`replication.protocol.connection`.

The rules are Synapse's (``synapse/replication/tcp/commands.py``, ``synapse/util/json.py``;
docs/replication.md, "The protocol core"). One older protocol generation is supported as well
(docs/replication.md, "The endpoint"): a client may send ``REPLICATE <stream>
<token>``, and our server can answer with the old three-field ``RDATA``/``POSITION`` lines.

Errors are named by who is at fault: :class:`RemoteProtocolError` when the peer sent
something we cannot accept (its ``error_text`` is what to send back in ``ERROR``), and
:class:`LocalProtocolError` when we are about to send something invalid.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from replication.protocol import wire_json as _wire_json
from replication.protocol.wire_json import _encode, decode_json, decode_row, encode_json

__all__ = [
    "MAX_LINE_LENGTH",
    "rdata_row_budget",
    "ProtocolError",
    "RemoteProtocolError",
    "LocalProtocolError",
    "Command",
    "ServerCommand",
    "RdataCommand",
    "RdataRun",
    "add_rdata_line",
    "PositionCommand",
    "ErrorCommand",
    "PingCommand",
    "NameCommand",
    "ReplicateCommand",
    "UserSyncCommand",
    "ClearUserSyncCommand",
    "FederationAckCommand",
    "UserIpCommand",
    "RemoteServerUpCommand",
    "LockReleasedCommand",
    "NewActiveTaskCommand",
    "CancelTaskCommand",
    "LegacyReplicateCommand",
    "LegacyRdataCommand",
    "LegacyPositionCommand",
    "COMMANDS_BY_NAME",
    "VALID_SERVER_COMMANDS",
    "VALID_CLIENT_COMMANDS",
    "parse_line",
    "format_command",
    "encode_json",
    "decode_json",
    "batch_updates",
    "group_updates",
]

#: Longest line (in bytes, newline excluded) either side accepts on TCP. It is the default
#: ``MAX_LENGTH`` of Twisted's ``LineOnlyReceiver``, which Synapse never overrides, so a
#: longer line makes a Synapse peer answer ``ERROR Line length exceeded`` and hang up.
MAX_LINE_LENGTH = 16384

#: Characters of the longest token a line may carry (a signed 64-bit integer).
_TOKEN_CHARS = len(str(-(2**63)))


def rdata_row_budget(stream_name: str, instance_name: str) -> int:
    """The most bytes a row's JSON may take for ``RDATA <stream> <instance> <token> <row>``
    to fit in :data:`MAX_LINE_LENGTH`, whatever its token (the older generation's RDATA,
    without the instance, is shorter)."""
    return MAX_LINE_LENGTH - len(f"RDATA {stream_name} {instance_name}  ".encode()) - _TOKEN_CHARS

# How much of an offending line (and of the exception) an error text quotes, so that the
# resulting ``ERROR`` line always fits in MAX_LINE_LENGTH (a repr'd character is at most
# 4 UTF-8 bytes; 2 * 1000 * 4 plus the fixed text stays well below 16384).
_QUOTE_LIMIT = 1000


# --- errors -------------------------------------------------------------------------------


class ProtocolError(Exception):
    """Base class of the replication protocol errors."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something we cannot accept.

    ``error_text`` is exactly what we answer with (``ERROR <error_text>``) before closing,
    e.g. ``invalid command: RDATA`` or ``Line length exceeded``.
    """

    def __init__(self, error_text: str) -> None:
        super().__init__(error_text)
        self.error_text = error_text


class LocalProtocolError(ProtocolError):
    """We tried to send something invalid: a newline in a command, a line that is too
    long, a value JSON cannot carry, or a command our side may not send."""


# --- JSON: Synapse's rules, in wire_json (encode_json and decode_json are part of this API) ----

# --- commands -----------------------------------------------------------------------------

C = TypeVar("C", bound="Command")


class Command:
    """A replication command. Subclasses are frozen dataclasses with a ``NAME``.

    ``to_line()`` gives the full wire text (``NAME + " " + body``, no newline);
    ``from_body(body)`` builds the command from the text after the first space and raises
    ``ValueError``/``TypeError`` on bad input (:func:`parse_line` turns that into a
    :class:`RemoteProtocolError`).
    """

    __slots__ = ()

    NAME: ClassVar[str]

    @classmethod
    def from_body(cls: type[C], body: str) -> C:
        raise NotImplementedError

    def to_line(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class _SimpleCommand(Command):
    """A command whose body is one free-form string, taken verbatim."""

    data: str

    @classmethod
    def from_body(cls: type[C], body: str) -> C:
        return cls(body)  # type: ignore[call-arg]

    def to_line(self) -> str:
        return self.NAME + " " + self.data


@dataclass(frozen=True, slots=True)
class ServerCommand(_SimpleCommand):
    """Sent by the server first thing on a new connection: its server name.

    Format::

        SERVER <server_name>

    Example: ``SERVER example.com``
    """

    NAME: ClassVar[str] = "SERVER"


@dataclass(frozen=True, slots=True)
class RdataCommand(Command):
    """One row of a stream, sent by the stream's writer.

    Format::

        RDATA <stream_name> <instance_name> <token> <row_json>

    Example: ``RDATA events master 57 ["ev",["$a:hs","!r:hs","m.room.member","@u:hs",null,null,"join",false,false]]``

    A *batch* is several rows sharing one stream ID: all but the last go out with the token
    ``batch`` (``token=None`` here), the last with the numeric ID, and the receiver holds
    ``batch`` rows per stream until the numeric one arrives. ``row_json`` may contain spaces.
    """

    NAME: ClassVar[str] = "RDATA"

    stream_name: str
    instance_name: str
    token: int | None
    row: Any

    @classmethod
    def from_body(cls, body: str) -> RdataCommand:
        stream_name, instance_name, token, row_json = body.split(" ", 3)
        parsed_token = None if token == "batch" else int(token)
        row = decode_row(row_json)
        if cls is not RdataCommand:
            return cls(stream_name, instance_name, parsed_token, row)
        # Every line a worker receives: a frozen dataclass's __init__ sets each field through
        # object.__setattr__ (~1 us here); filling the slots directly makes the same, still
        # frozen, command in a third of that.
        cmd = _new_object(cls)
        _set_rdata_stream(cmd, stream_name)
        _set_rdata_instance(cmd, instance_name)
        _set_rdata_token(cmd, parsed_token)
        _set_rdata_row(cmd, row)
        return cmd

    def to_line(self) -> str:
        token = self.token
        return "RDATA %s %s %s %s" % (
            self.stream_name,
            self.instance_name,
            "batch" if token is None else token,
            _encode(self.row),
        )


_new_object = object.__new__
_set_rdata_stream = RdataCommand.__dict__["stream_name"].__set__
_set_rdata_instance = RdataCommand.__dict__["instance_name"].__set__
_set_rdata_token = RdataCommand.__dict__["token"].__set__
_set_rdata_row = RdataCommand.__dict__["row"].__set__


class RdataRun:
    """Consecutive RDATA lines of one stream and writer, parsed without a command per line.

    A worker receives RDATA by the thousand per read, almost all of one (stream, writer) in a
    row; making an :class:`RdataCommand` for each and handing each to the follower on its
    own cost as much as decoding its JSON. ``entries`` are ``(token, row)`` in arrival order
    (``token`` None for ``batch``), exactly what :meth:`RdataCommand.from_body` would have
    read; :meth:`commands` gives those commands when they are wanted after all.
    """

    __slots__ = ("stream_name", "instance_name", "entries")

    def __init__(self, stream_name: str, instance_name: str, entries: list[tuple[int | None, Any]]) -> None:
        self.stream_name = stream_name
        self.instance_name = instance_name
        self.entries = entries

    def commands(self) -> list[RdataCommand]:
        return [RdataCommand(self.stream_name, self.instance_name, token, row) for token, row in self.entries]

    def __eq__(self, other: object) -> bool:
        return (type(other) is RdataRun and self.stream_name == other.stream_name
                and self.instance_name == other.instance_name and self.entries == other.entries)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"RdataRun({self.stream_name!r}, {self.instance_name!r}, {len(self.entries)} entries)"


def add_rdata_line(out: list[Any], line: bytes | str) -> bool:
    """Parse ``line`` (as received, or decoded) if it is a well-formed current-generation RDATA
    line and add it to ``out``: to its last item if that is the :class:`RdataRun` of the same
    stream and writer, else as a new run. Returns False, changing nothing, for any other line
    (another command, or an RDATA line :func:`parse_line` would refuse: the caller takes that
    way for the error).

    Bytes are split and their row decoded without decoding the line first (a worker's hot
    path); a line that way cannot take (invalid UTF-8, a token in non-ASCII digits) is decoded
    and read as text, so both give the same runs.
    """
    if not isinstance(line, bytes):
        return _add_rdata_text(out, line)
    if not line.startswith(b"RDATA "):
        return False
    try:
        # the same fields and conversions as RdataCommand.from_body, in the same order
        _, stream, instance, token, row_json = line.split(b" ", 4)
        parsed_token = None if token == b"batch" else int(token)
        try:  # decode_row, inline (once per fact in every worker)
            row = _wire_json.row_decoder(row_json)
        except Exception:
            row = decode_row(row_json)
        stream_name, instance_name = stream.decode(), instance.decode()
    except Exception:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return _add_rdata_text(out, text)
    last = out[-1] if out else None
    if type(last) is RdataRun and last.instance_name == instance_name and last.stream_name == stream_name:
        last.entries.append((parsed_token, row))
    else:
        out.append(RdataRun(stream_name, instance_name, [(parsed_token, row)]))
    return True


def _add_rdata_text(out: list[Any], line: str) -> bool:
    """:func:`add_rdata_line` of a decoded line."""
    if not line.startswith("RDATA "):
        return False
    try:
        _, stream_name, instance_name, token, row_json = line.split(" ", 4)
        parsed_token = None if token == "batch" else int(token)
        row = decode_row(row_json)
    except Exception:
        return False
    last = out[-1] if out else None
    if type(last) is RdataRun and last.instance_name == instance_name and last.stream_name == stream_name:
        last.entries.append((parsed_token, row))
    else:
        out.append(RdataRun(stream_name, instance_name, [(parsed_token, row)]))
    return True


@dataclass(frozen=True, slots=True)
class PositionCommand(Command):
    """A writer's promise that it wrote no rows in ``(prev_token, new_token]``.

    Format::

        POSITION <stream_name> <instance_name> <prev_token> <new_token>

    Example: ``POSITION caches worker1 5 9``

    After ``REPLICATE`` (or when it has announced nothing before) a writer sends
    ``prev_token == new_token``.
    """

    NAME: ClassVar[str] = "POSITION"

    stream_name: str
    instance_name: str
    prev_token: int
    new_token: int

    @classmethod
    def from_body(cls, body: str) -> PositionCommand:
        stream_name, instance_name, prev_token, new_token = body.split(" ", 3)
        return cls(stream_name, instance_name, int(prev_token), int(new_token))

    def to_line(self) -> str:
        return "POSITION %s %s %d %d" % (
            self.stream_name,
            self.instance_name,
            self.prev_token,
            self.new_token,
        )


@dataclass(frozen=True, slots=True)
class ErrorCommand(_SimpleCommand):
    """Either side reports an error; the sender closes the connection right after.

    Format::

        ERROR <text>

    Example: ``ERROR invalid command: RDATA``
    """

    NAME: ClassVar[str] = "ERROR"


@dataclass(frozen=True, slots=True)
class PingCommand(_SimpleCommand):
    """Keepalive from either side; the body is arbitrary (Synapse sends the time in ms).
    The first PING from a peer switches its inactivity timeout on.

    Format::

        PING <data>

    Example: ``PING 1490197665618``
    """

    NAME: ClassVar[str] = "PING"


@dataclass(frozen=True, slots=True)
class NameCommand(_SimpleCommand):
    """Sent by the client first thing on connect: a label for logs and metrics.

    Format::

        NAME <client_name>

    Example: ``NAME synapse.app.generic_worker``
    """

    NAME: ClassVar[str] = "NAME"


@dataclass(frozen=True, slots=True)
class ReplicateCommand(Command):
    """Asks every writer to announce its position in each stream it writes (``POSITION s
    me t t``). The body is empty on the wire and ignored by :meth:`from_body`; a non-blank
    body makes :func:`parse_line` read the line as a :class:`LegacyReplicateCommand`.

    Format::

        REPLICATE

    Example: ``REPLICATE `` (note the trailing space)
    """

    NAME: ClassVar[str] = "REPLICATE"

    @classmethod
    def from_body(cls, body: str) -> ReplicateCommand:
        return cls()

    def to_line(self) -> str:
        return "REPLICATE "


_SYNC_STATES = {"start": True, "end": False}


@dataclass(frozen=True, slots=True)
class UserSyncCommand(Command):
    """A user started or stopped syncing on the sending process (for presence).

    Format::

        USER_SYNC <instance_id> <user_id> <device_id> <start|end> <last_sync_ms>

    Example: ``USER_SYNC abcde @u:hs None start 1700000000000``

    ``instance_id`` is a random per-process-run ID; ``device_id`` ``None`` (the literal
    text) means "no device", so a device really called ``None`` cannot be expressed.
    """

    NAME: ClassVar[str] = "USER_SYNC"

    instance_id: str
    user_id: str
    device_id: str | None
    is_syncing: bool
    last_sync_ms: int

    @classmethod
    def from_body(cls, body: str) -> UserSyncCommand:
        instance_id, user_id, device_id, state, last_sync_ms = body.split(" ", 4)
        if state not in _SYNC_STATES:
            raise ValueError(f"Invalid USER_SYNC state {state!r}")
        return cls(
            instance_id,
            user_id,
            None if device_id == "None" else device_id,
            _SYNC_STATES[state],
            int(last_sync_ms),
        )

    def to_line(self) -> str:
        return "USER_SYNC %s %s %s %s %d" % (
            self.instance_id,
            self.user_id,
            self.device_id,  # None -> "None", like Synapse's str(None)
            "start" if self.is_syncing else "end",
            self.last_sync_ms,
        )


@dataclass(frozen=True, slots=True)
class ClearUserSyncCommand(Command):
    """A syncing process shutting down: forget every sync it reported.

    Format::

        CLEAR_USER_SYNC <instance_id>

    Example: ``CLEAR_USER_SYNC abcde``
    """

    NAME: ClassVar[str] = "CLEAR_USER_SYNC"

    instance_id: str

    @classmethod
    def from_body(cls, body: str) -> ClearUserSyncCommand:
        return cls(body)

    def to_line(self) -> str:
        return "CLEAR_USER_SYNC " + self.instance_id


@dataclass(frozen=True, slots=True)
class FederationAckCommand(Command):
    """A federation sender has processed the federation stream up to ``token``.

    Format::

        FEDERATION_ACK <instance_name> <token>

    Example: ``FEDERATION_ACK fed1 12``

    Exactly two fields: the body is split on every space, so an extra field is an error.
    """

    NAME: ClassVar[str] = "FEDERATION_ACK"

    instance_name: str
    token: int

    @classmethod
    def from_body(cls, body: str) -> FederationAckCommand:
        instance_name, token = body.split(" ")
        return cls(instance_name, int(token))

    def to_line(self) -> str:
        return "FEDERATION_ACK %s %d" % (self.instance_name, self.token)


def _check_str(value: object, what: str) -> str:
    if type(value) is not str:
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")
    return value


def _check_json_array(value: object, length: int, what: str) -> list[Any]:
    if type(value) is not list or len(value) != length:
        raise ValueError(f"{what} must be a JSON array of {length} elements")
    return value


@dataclass(frozen=True, slots=True)
class UserIpCommand(Command):
    """A process saw client activity from ``user_id``.

    Format::

        USER_IP <user_id> [<access_token>,<ip>,<user_agent>,<device_id|null>,<last_seen_ms>]

    Example: ``USER_IP @u:hs ["tok","1.2.3.4","UA",null,1700000000000]``

    (Synapse's own docstring lists another, comma-separated order; this is what its code
    sends.) The access token is kept out of ``repr()``.
    """

    NAME: ClassVar[str] = "USER_IP"

    user_id: str
    access_token: str = field(repr=False)
    ip: str
    user_agent: str
    device_id: str | None
    last_seen: int

    @classmethod
    def from_body(cls, body: str) -> UserIpCommand:
        user_id, payload = body.split(" ", 1)
        values = _check_json_array(decode_json(payload), 5, "USER_IP payload")
        access_token, ip, user_agent, device_id, last_seen = values
        if device_id is not None:
            _check_str(device_id, "USER_IP device_id")
        if type(last_seen) is not int:
            raise TypeError("USER_IP last_seen must be an integer")
        return cls(
            user_id,
            _check_str(access_token, "USER_IP access_token"),
            _check_str(ip, "USER_IP ip"),
            _check_str(user_agent, "USER_IP user_agent"),
            device_id,
            last_seen,
        )

    def to_line(self) -> str:
        return (
            "USER_IP "
            + self.user_id
            + " "
            + _encode(
                (self.access_token, self.ip, self.user_agent, self.device_id, self.last_seen)
            )
        )


@dataclass(frozen=True, slots=True)
class RemoteServerUpCommand(_SimpleCommand):
    """A remote homeserver seems reachable again: reset its federation backoff.

    Format::

        REMOTE_SERVER_UP <server_name>

    Example: ``REMOTE_SERVER_UP matrix.org``
    """

    NAME: ClassVar[str] = "REMOTE_SERVER_UP"


@dataclass(frozen=True, slots=True)
class LockReleasedCommand(Command):
    """An instance released a database-backed lock; waiters elsewhere may retry.

    Format::

        LOCK_RELEASED ["<instance_name>","<lock_name>","<lock_key>"]

    Example: ``LOCK_RELEASED ["w1","lock","key"]``
    """

    NAME: ClassVar[str] = "LOCK_RELEASED"

    instance_name: str
    lock_name: str
    lock_key: str

    @classmethod
    def from_body(cls, body: str) -> LockReleasedCommand:
        values = _check_json_array(decode_json(body), 3, "LOCK_RELEASED payload")
        instance_name, lock_name, lock_key = values
        return cls(
            _check_str(instance_name, "LOCK_RELEASED instance_name"),
            _check_str(lock_name, "LOCK_RELEASED lock_name"),
            _check_str(lock_key, "LOCK_RELEASED lock_key"),
        )

    def to_line(self) -> str:
        return "LOCK_RELEASED " + _encode((self.instance_name, self.lock_name, self.lock_key))


@dataclass(frozen=True, slots=True)
class NewActiveTaskCommand(_SimpleCommand):
    """A task was scheduled to run now; the background-tasks instance launches it.
    The body is the raw task ID (no JSON quotes). Redis only: on TCP neither side may
    send it.

    Format::

        NEW_ACTIVE_TASK <task_id>

    Example: ``NEW_ACTIVE_TASK abc123``
    """

    NAME: ClassVar[str] = "NEW_ACTIVE_TASK"


@dataclass(frozen=True, slots=True)
class CancelTaskCommand(_SimpleCommand):
    """Cancel a scheduled task; the body is the raw task ID. Redis only, like
    NEW_ACTIVE_TASK.

    Format::

        CANCEL_TASK <task_id>

    Example: ``CANCEL_TASK abc123``
    """

    NAME: ClassVar[str] = "CANCEL_TASK"


# --- the older protocol generation --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LegacyReplicateCommand(Command):
    """Old-generation subscription: stream ``stream_name`` from ``token`` on.

    Format::

        REPLICATE <stream_name|ALL> <token|NOW>

    Example: ``REPLICATE events 53``

    ``token`` stays text: ASCII digits, or ``NOW`` for "only future updates" (``now`` is
    accepted and normalised, as the old parser did). ``ALL`` subscribes to every stream
    and is only valid with ``NOW``. :func:`parse_line` produces this for a ``REPLICATE``
    line whose body is not blank.
    """

    NAME: ClassVar[str] = "REPLICATE"

    stream_name: str
    token: str

    @classmethod
    def from_body(cls, body: str) -> LegacyReplicateCommand:
        stream_name, token = body.split(" ", 1)
        if not stream_name:
            raise ValueError("REPLICATE needs a stream name")
        if token in ("NOW", "now"):
            token = "NOW"
        elif not (token.isascii() and token.isdigit()):
            raise ValueError(f"REPLICATE token must be digits or NOW, not {token!r}")
        if stream_name == "ALL" and token != "NOW":
            raise ValueError("REPLICATE ALL is only valid with the token NOW")
        return cls(stream_name, token)

    def to_line(self) -> str:
        return "REPLICATE %s %s" % (self.stream_name, self.token)


@dataclass(frozen=True, slots=True)
class LegacyRdataCommand(Command):
    """Old-generation row (no instance name). Only ever sent by our server:
    :func:`parse_line` always reads ``RDATA`` as :class:`RdataCommand`.

    Format::

        RDATA <stream_name> <token|batch> <row_json>

    Example: ``RDATA caches batch ["get_user_by_id",["@test:localhost:8823"],1490197670513]``
    """

    NAME: ClassVar[str] = "RDATA"

    stream_name: str
    token: int | None
    row: Any

    @classmethod
    def from_body(cls, body: str) -> LegacyRdataCommand:
        stream_name, token, row_json = body.split(" ", 2)
        return cls(stream_name, None if token == "batch" else int(token), decode_json(row_json))

    def to_line(self) -> str:
        token = self.token
        return "RDATA %s %s %s" % (
            self.stream_name,
            "batch" if token is None else token,
            _encode(self.row),
        )


@dataclass(frozen=True, slots=True)
class LegacyPositionCommand(Command):
    """Old-generation position: the client is up to date with ``stream_name`` at ``token``.
    Only ever sent by our server (:func:`parse_line` reads ``POSITION`` as
    :class:`PositionCommand`).

    Format::

        POSITION <stream_name> <token>

    Example: ``POSITION events 53``
    """

    NAME: ClassVar[str] = "POSITION"

    stream_name: str
    token: int

    @classmethod
    def from_body(cls, body: str) -> LegacyPositionCommand:
        stream_name, token = body.split(" ", 1)
        return cls(stream_name, int(token))

    def to_line(self) -> str:
        return "POSITION %s %d" % (self.stream_name, self.token)


# --- the grammar as data ------------------------------------------------------------------

#: Command name -> the class :func:`parse_line` builds (current generation only).
COMMANDS_BY_NAME: dict[str, type[Command]] = {
    cls.NAME: cls
    for cls in (
        ServerCommand,
        RdataCommand,
        PositionCommand,
        ErrorCommand,
        PingCommand,
        NameCommand,
        ReplicateCommand,
        UserSyncCommand,
        ClearUserSyncCommand,
        FederationAckCommand,
        UserIpCommand,
        RemoteServerUpCommand,
        LockReleasedCommand,
        NewActiveTaskCommand,
        CancelTaskCommand,
    )
}

# Names whose line is read as an older-generation command when the body is not blank.
_LEGACY_WHEN_BODY: dict[str, type[Command]] = {"REPLICATE": LegacyReplicateCommand}

#: What a TCP server may send (Synapse's ``VALID_SERVER_COMMANDS``, ``synapse/replication/tcp/commands.py``).
#: NEW_ACTIVE_TASK and CANCEL_TASK are Redis-only.
VALID_SERVER_COMMANDS: frozenset[str] = frozenset(
    {"SERVER", "RDATA", "POSITION", "ERROR", "PING", "REMOTE_SERVER_UP", "LOCK_RELEASED"}
)

#: What a TCP client may send (Synapse's ``VALID_CLIENT_COMMANDS``).
VALID_CLIENT_COMMANDS: frozenset[str] = frozenset(
    {
        "NAME",
        "REPLICATE",
        "PING",
        "USER_SYNC",
        "CLEAR_USER_SYNC",
        "FEDERATION_ACK",
        "USER_IP",
        "ERROR",
        "REMOTE_SERVER_UP",
        "LOCK_RELEASED",
    }
)


def _quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE_LIMIT else text[:_QUOTE_LIMIT] + "..."


def _parse_error_text(exc: BaseException, line: object) -> str:
    """The ``ERROR`` text for an unparsable line, in Synapse's format
    ``failed to parse line: <exception repr> (<line repr>):`` (long reprs are cut)."""
    return "failed to parse line: %s (%s):" % (_quote(exc), _quote(line))


def parse_line(line: str) -> Command:
    """Parse one received line (no newline) into a command.

    The name is the text before the first space, the body everything after it (empty when
    there is no space). The line is not stripped: a trailing ``\\r`` ends up in the last
    field. Any failure, an unknown name included, raises :class:`RemoteProtocolError`
    with the ``failed to parse line: ...`` text.
    """
    name, _, body = line.partition(" ")
    try:
        cls = COMMANDS_BY_NAME[name]
        if name in _LEGACY_WHEN_BODY and body and not body.isspace():
            cls = _LEGACY_WHEN_BODY[name]
        return cls.from_body(body)
    except Exception as e:  # anything the peer's text provokes is the peer's fault
        raise RemoteProtocolError(_parse_error_text(e, line)) from e


def format_command(cmd: Command) -> str:
    """The wire text of ``cmd`` (no newline); :class:`LocalProtocolError` if it cannot be
    sent: a value JSON cannot carry, or a newline anywhere in the line."""
    try:
        line = cmd.to_line()
    except (ValueError, TypeError, RecursionError) as e:
        raise LocalProtocolError(f"cannot serialise {cmd.NAME}: {e}") from e
    if "\n" in line:
        raise LocalProtocolError(f"newline in {cmd.NAME} command: {line[:200]!r}")
    return line


# --- batching (docs/replication.md, "Catch-up") -------------------------------------------------------------------

T = TypeVar("T")


def batch_updates(updates: list[tuple[int, T]]) -> list[tuple[int | None, T]]:
    """Sender side: give every row whose successor has the same stream ID the token
    ``None`` (``batch`` on the wire), so only the last row of a stream ID carries it.

    ``[(1,a),(1,b),(2,c)] -> [(None,a),(1,b),(2,c)]``. ``updates`` is sorted by token.
    """
    out: list[tuple[int | None, T]] = []
    append = out.append
    for (token, row), (next_token, _) in zip(updates, updates[1:]):
        append((None if token == next_token else token, row))
    if updates:
        append(updates[-1])
    return out


def group_updates(updates: list[tuple[int, T]]) -> list[tuple[int, list[T]]]:
    """Catch-up side: gather consecutive rows that share a stream ID.

    ``[(1,a),(1,b),(2,c)] -> [(1,[a,b]),(2,[c])]``; no updates give an empty list.
    """
    return [
        (token, [row for _, row in group])
        for token, group in itertools.groupby(updates, key=lambda update: update[0])
    ]
