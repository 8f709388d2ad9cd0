"""One replication TCP connection as a sans-I/O state machine (design: docs/replication.md).

Like h11, :class:`ReplicationConnection` never touches a socket, a timer or a clock: the
adapter feeds it the bytes it read (:meth:`~ReplicationConnection.receive_data`), pulls
commands out (:meth:`~ReplicationConnection.next_event`), asks it for the bytes to write
(:meth:`~ReplicationConnection.send`, :meth:`~ReplicationConnection.send_many`), and passes
the current time in so that it can answer the keepalive questions
(:meth:`~ReplicationConnection.ping_due`, :meth:`~ReplicationConnection.timed_out`).

Framing follows Synapse's Twisted ``LineOnlyReceiver``: lines end with ``\\n`` only, are
UTF-8, must not exceed ``max_line_length`` bytes (the newline excluded), and lines that are
blank after ``bytes.strip()`` are skipped. A ``\\r`` before the newline is kept. Data still
unterminated at EOF is dropped, as Twisted does.

After a :class:`RemoteProtocolError` the connection is dead for reading: every later
``next_event`` raises the same error. The adapter sends ``ERROR <error_text>`` (``send``
still works) and closes, which is what Synapse does.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Final, NoReturn

from replication.protocol.commands import (
    MAX_LINE_LENGTH,
    VALID_CLIENT_COMMANDS,
    VALID_SERVER_COMMANDS,
    Command,
    LocalProtocolError,
    RdataRun,
    RemoteProtocolError,
    _parse_error_text,
    add_rdata_line,
    format_command,
    parse_line,
)
from replication.protocol.line_batch import LineBatch

__all__ = [
    "NEED_DATA",
    "CLOSED",
    "PING_INTERVAL",
    "PING_TIMEOUT",
    "ReplicationConnection",
]

#: Send a PING when nothing at all was sent for this many seconds (Synapse's ``PING_TIME``).
PING_INTERVAL: Final = 5.0
#: Give up on a peer that sends PINGs once nothing arrived for longer than this many
#: seconds: five ping intervals (Synapse's ``PING_TIMEOUT_MS``; its prose docs say 15 s).
PING_TIMEOUT: Final = 25.0


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: :meth:`ReplicationConnection.next_event`: no complete line yet, feed more bytes.
NEED_DATA: Final = _Sentinel("NEED_DATA")
#: :meth:`ReplicationConnection.next_event`: the peer closed and every line was consumed.
CLOSED: Final = _Sentinel("CLOSED")

# Who may send what, by role, and who sits at the other end.
_MAY_SEND: Final = {"server": VALID_SERVER_COMMANDS, "client": VALID_CLIENT_COMMANDS}
_PEER_OF: Final = {"server": "client", "client": "server"}

_LINE_LENGTH_EXCEEDED: Final = "Line length exceeded"


class ReplicationConnection:
    """The protocol state of our end of one replication connection.

    ``our_role`` is ``"server"`` (the process that accepted the connection and sources
    streams) or ``"client"`` (the worker that connected). ``now`` is the current time in
    seconds, on whatever clock the caller uses for every later ``now``; it starts both the
    "last sent" and "last received" clocks.

    Public state, read-only for callers: ``our_role``, ``their_role``, ``last_sent``,
    ``last_received`` (times of the last line we produced / the last valid command we
    took), ``peer_sends_pings`` (the peer sent at least one PING, which arms
    :meth:`timed_out`), ``connected_at`` and ``handshake_done`` (the peer sent a REPLICATE;
    until then :meth:`handshake_overdue` may answer True). ``handshake_timeout`` and
    ``line_timeout`` (seconds, None: never) arm :meth:`handshake_overdue` and
    :meth:`line_overdue`.
    """

    def __init__(
        self, our_role: str, *, now: float, max_line_length: int = MAX_LINE_LENGTH,
        handshake_timeout: float | None = None, line_timeout: float | None = None,
    ) -> None:
        if our_role not in _PEER_OF:
            raise ValueError(f"our_role must be 'server' or 'client', not {our_role!r}")
        self.our_role = our_role
        self.their_role = _PEER_OF[our_role]
        self.max_line_length = max_line_length
        self.last_sent = now
        self.last_received = now
        self.peer_sends_pings = False
        self.connected_at = now
        self.handshake_timeout = handshake_timeout
        self.line_timeout = line_timeout
        #: The peer sent a REPLICATE (either generation): it is following streams.
        self.handshake_done = False
        self._partial_since: float | None = None  # when the unterminated line began
        self._may_send = _MAY_SEND[our_role]
        self._may_receive = _MAY_SEND[self.their_role]
        self._lines: deque[bytes] = deque()  # complete lines, newline stripped
        self._partial = b""  # bytes after the last newline
        self._partial_too_long = False
        self._eof = False
        self._error: str | None = None  # error text, once the peer broke the protocol

    # --- receiving ------------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float | None = None) -> None:
        """Feed bytes read from the peer; ``b""`` means the peer closed (EOF). ``now`` (when
        given) dates an unterminated line, for :meth:`line_overdue`."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise LocalProtocolError("received data after EOF")
        if self._partial_too_long:
            return  # the connection is already condemned; don't buffer without bound
        had_partial = bool(self._partial)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if lines:
            self._lines.extend(lines)
        if not self._partial:
            self._partial_since = None
        elif lines or not had_partial:  # a new unterminated line began in this chunk
            self._partial_since = now
        if len(self._partial) > self.max_line_length:
            self._partial_too_long = True
            self._partial = b""

    def next_event(self, now: float) -> Command | _Sentinel:
        """The next command from the peer, or :data:`NEED_DATA` / :data:`CLOSED`.

        Raises :class:`RemoteProtocolError` (with the ``ERROR`` text to answer) for an
        over-long line, invalid UTF-8, an unparsable line, or a command the peer's role
        may not send. Each command returned sets ``last_received = now``; a PING also sets
        ``peer_sends_pings``.
        """
        if self._error is not None:
            raise RemoteProtocolError(self._error)
        lines = self._lines
        while lines:
            cmd = self._command(lines.popleft())
            if cmd is not None:
                self.last_received = now
                return cmd
        if self._partial_too_long:
            self._fail(_LINE_LENGTH_EXCEEDED)
        if self._eof:
            return CLOSED
        return NEED_DATA

    def next_events(self, now: float) -> list[Command]:
        """Every command of the complete lines received so far (``[]``: none).

        :meth:`next_event` for a whole chunk at once (one call per read
        instead of one per line). A bad line ends the list: the commands before it are
        returned, and the *next* call raises its :class:`RemoteProtocolError`, as
        :meth:`next_event` would have on reaching it. :data:`CLOSED` and :data:`NEED_DATA`
        are still :meth:`next_event`'s to tell.
        """
        return self._drain(now, runs=False)  # type: ignore[return-value]

    def next_batch(self, now: float) -> list[Command | RdataRun]:
        """:meth:`next_events`, with each run of RDATA lines of one stream and writer as one
        :class:`~.commands.RdataRun` (a worker's hot path: no command object per fact). The
        same checks, the same errors, at the same line."""
        return self._drain(now, runs=True)

    def _drain(self, now: float, runs: bool) -> list[Command | RdataRun]:
        """The commands of the complete lines received so far, RDATA gathered in runs if
        ``runs`` (:meth:`next_events`, :meth:`next_batch`)."""
        if self._error is not None:
            raise RemoteProtocolError(self._error)
        out: list[Command | RdataRun] = []
        lines = self._lines
        command = self._command
        fast = runs and "RDATA" in self._may_receive
        limit = self.max_line_length
        try:
            while lines:
                raw = lines.popleft()
                if fast and raw.startswith(b"RDATA ") and len(raw) <= limit and add_rdata_line(out, raw):
                    continue  # else _command names the error
                cmd = command(raw)
                if cmd is not None:
                    out.append(cmd)
        except RemoteProtocolError:
            if not out:
                raise
        if out:
            self.last_received = now
        return out

    def _command(self, raw: bytes) -> Command | None:
        """The command of one received line (None for a blank line); a bad one fails the
        connection (:meth:`_fail`)."""
        if len(raw) > self.max_line_length:
            self._fail(_LINE_LENGTH_EXCEEDED)
        if not raw.strip():
            return None
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self._fail(_parse_error_text(e, raw), e)
        try:
            cmd = parse_line(line)
        except RemoteProtocolError as e:
            self._fail(e.error_text, e)
        name = cmd.NAME
        if name not in self._may_receive:
            self._fail(f"invalid command: {name}")
        if name == "PING":
            self.peer_sends_pings = True
        elif name == "REPLICATE":
            self.handshake_done = True
        return cmd

    def _fail(self, error_text: str, cause: BaseException | None = None) -> NoReturn:
        self._error = error_text
        self._lines.clear()
        raise RemoteProtocolError(error_text) from cause

    # --- sending --------------------------------------------------------------------------

    def send(self, cmd: Command, now: float) -> bytes:
        """The bytes to write for ``cmd`` (one line with its newline).

        Raises :class:`LocalProtocolError` if our role may not send it, if it contains a
        newline or cannot be serialised, or if it is longer than ``max_line_length``.
        """
        if cmd.NAME not in self._may_send:
            raise LocalProtocolError(f"a {self.our_role} may not send {cmd.NAME}")
        data = self._encode(format_command(cmd), cmd)
        self.last_sent = now
        return data + b"\n"

    def send_many(self, cmds: Iterable[Command], now: float) -> bytes:
        """The bytes for several commands at once, for one coalesced write.

        All or nothing: if any command is invalid, :class:`LocalProtocolError` is raised
        and none of them counts as sent. An empty ``cmds`` gives ``b""`` and changes
        nothing.
        """
        # The hot path of the server (every RDATA goes through here), so the per-line
        # work is kept to the direction check, to_line() and a length test; newlines are
        # counted once over the joined text and the text is encoded once.
        may_send = self._may_send
        # A line of at most this many characters cannot exceed the byte limit (UTF-8
        # needs at most 4 bytes per character), so only longer ones are measured.
        safe_chars = self.max_line_length // 4
        lines: list[str] = []
        append = lines.append
        for cmd in cmds:
            if cmd.NAME not in may_send:
                raise LocalProtocolError(f"a {self.our_role} may not send {cmd.NAME}")
            try:
                line = cmd.to_line()
            except (ValueError, TypeError, RecursionError) as e:
                raise LocalProtocolError(f"cannot serialise {cmd.NAME}: {e}") from e
            if len(line) > safe_chars:
                self._encode(line, cmd)
            append(line)
        if not lines:
            return b""
        append("")  # for the final newline
        text = "\n".join(lines)
        if text.count("\n") != len(lines) - 1:  # some command carries a newline
            bad = next(line for line in lines if "\n" in line)
            raise LocalProtocolError(f"newline in command: {bad[:200]!r}")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise LocalProtocolError(f"command not encodable as UTF-8: {e}") from e
        self.last_sent = now
        return data

    def send_batch(self, batch: LineBatch, now: float) -> bytes:
        """The bytes of lines encoded elsewhere (the writer's RDATA relayed, a history page):
        checked by their counts -- our role must be allowed every command they hold -- and
        counted as sent, so that :meth:`ping_due` sees them. An empty batch changes nothing."""
        if not batch.counts:
            return b""
        for name in batch.counts:
            if name not in self._may_send:
                raise LocalProtocolError(f"a {self.our_role} may not send {name}")
        self.last_sent = now
        return batch.data

    def _encode(self, line: str, cmd: Command) -> bytes:
        try:
            data = line.encode("utf-8")
        except UnicodeEncodeError as e:
            raise LocalProtocolError(f"{cmd.NAME} command not encodable as UTF-8: {e}") from e
        if len(data) > self.max_line_length:
            raise LocalProtocolError(
                f"{cmd.NAME} command too long ({len(data)} > {self.max_line_length} bytes)"
            )
        return data

    # --- keepalive decisions --------------------------------------------------------------

    def ping_due(self, now: float) -> bool:
        """Whether to send a PING now: nothing was sent for ``PING_INTERVAL`` seconds."""
        return now - self.last_sent >= PING_INTERVAL

    def timed_out(self, now: float) -> bool:
        """Whether to give up on the peer (``ERROR ping timeout`` and close): it has sent
        a PING, so it promised to keep talking, and nothing valid arrived for more than
        ``PING_TIMEOUT`` seconds."""
        return self.peer_sends_pings and now - self.last_received > PING_TIMEOUT

    def handshake_overdue(self, now: float) -> bool:
        """Whether to give up on a peer that has not subscribed (no REPLICATE) within
        ``handshake_timeout`` seconds of connecting: it holds a connection slot for nothing.
        Synapse's workers send NAME, PING and REPLICATE at once."""
        return (self.handshake_timeout is not None and not self.handshake_done
                and now - self.connected_at > self.handshake_timeout)

    def line_overdue(self, now: float) -> bool:
        """Whether an unterminated line has been arriving for longer than ``line_timeout``
        seconds (a slow-loris peer sending a byte at a time)."""
        return (self.line_timeout is not None and self._partial_since is not None
                and now - self._partial_since > self.line_timeout)
