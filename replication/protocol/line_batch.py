"""Outbound lines as one value, from the writer that makes them to the socket that sends them.

A writer's streamer encodes the lines of one advance once (:func:`encode_run`): a
:class:`WriterRun`, its RDATA/POSITION lines as bytes with the commands per name. Its one
serialized form is the channel-layer message :meth:`WriterRun.to_message` makes (the
layer's serializer turns it into bytes on Redis); an endpoint's relay reads it back with
:meth:`WriterRun.from_message` and from there on passes typed values only. Every path that
writes to a replication connection hands the consumer a :class:`LineBatch` (the relay's
batches of a writer's run, its repairs, the embedded scan, a legacy history page, a command
relayed from another worker), and the connection state machine accepts it
(:meth:`ReplicationConnection.send_batch`): so relayed bytes move its ``last_sent`` (the server
pings only after silence, as Synapse's does) and the counters come from the counts, never from
sniffing bytes. The counts are known where the lines are made: the writer counts once, not
each of an endpoint's connections.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from replication.protocol.commands import (
    MAX_LINE_LENGTH,
    Command,
    PositionCommand,
    RdataCommand,
)
from replication.protocol.wire_json import encode_rows

#: ``type`` of the channel-layer message that carries a writer's run.
RUN_MESSAGE_TYPE = "replication.lines"


def counts_of(lines: Iterable[str]) -> dict[str, int]:
    """Commands per name of ``lines`` (each a whole line, without newline)."""
    counts: dict[str, int] = {}
    for line in lines:
        name = line.split(" ", 1)[0]
        counts[name] = counts.get(name, 0) + 1
    return counts


def add_counts(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for name, n in b.items():
        out[name] = out.get(name, 0) + n
    return out


def build_lines(stream_name: str, writer: str, prev: int, new: int,
                facts: Sequence[tuple[int, Sequence[Any]]]) -> list[str]:
    """RDATA/POSITION lines for ``facts`` (wire tokens, ascending) covering ``(prev, new]``."""
    return [line.decode() for line in build_line_bytes(stream_name, writer, prev, new, facts)]


def build_line_bytes(stream_name: str, writer: str, prev: int, new: int,
                     facts: Sequence[tuple[int, Sequence[Any]]]) -> list[bytes]:
    """:func:`build_lines`, encoded: what a writer's streamer sends. The rows are encoded
    together (:func:`~.wire_json.encode_rows`: msgspec where its bytes are the standard
    encoder's), each line made as bytes, never as text first."""
    # RdataCommand(...).to_line().encode() without a command object per row (hot path; tests
    # check the lines are the same)
    prefix = f"{RdataCommand.NAME} {stream_name} {writer} ".encode()
    if all(len(rows) == 1 for _, rows in facts):  # the usual advance: a row per fact
        jsons = encode_rows([rows[0] for _, rows in facts])
        lines = [b"%s%d %s" % (prefix, token, row) for (token, _), row in zip(facts, jsons)]
        last = facts[-1][0] if facts else None
    else:
        jsons = encode_rows([row for _, rows in facts for row in rows])
        batch_prefix = prefix + b"batch "
        lines = []
        append = lines.append
        last = None
        i = 0
        for token, rows in facts:
            if not rows:
                continue
            n = len(rows) - 1
            for row in jsons[i:i + n]:
                append(batch_prefix + row)
            append(b"%s%d %s" % (prefix, token, jsons[i + n]))
            i += n + 1
            last = token
    if last is None:
        lines.append(PositionCommand(stream_name, writer, prev, new).to_line().encode())
    elif last < new:
        lines.append(PositionCommand(stream_name, writer, last, new).to_line().encode())
    return lines


@dataclass(frozen=True)
class OversizedLine:
    """A line :func:`fit_lines` kept back: the fact's token and the line's length in bytes."""

    token: int
    length: int


def fit_lines(stream_name: str, writer: str, prev: int, new: int,
              lines: list[bytes]) -> tuple[list[bytes], OversizedLine | None]:
    """``lines`` (:func:`build_lines`' output, encoded) if none is longer than
    :data:`MAX_LINE_LENGTH`; otherwise the lines before the first fact with a longer line,
    then ``POSITION <stream> <writer> t new`` with ``t`` that fact's token, and what was cut.

    A peer (Synapse's ``LineOnlyReceiver`` as ours) hangs up on a longer line, so sending one
    would disconnect every worker of every endpoint. The POSITION starts above what the lines
    before it leave a worker at, so each worker fetches ``(its token, new]`` from the catch-up
    endpoint (an HTTP answer, which has no line limit): the facts are delivered, not lost."""
    limit = MAX_LINE_LENGTH
    if not lines or max(map(len, lines)) <= limit:
        return lines, None
    first = next(i for i, line in enumerate(lines) if len(line) > limit)
    # the fact's token: the line's own, or (a ``batch`` row) the next numbered line's
    token = next(int(line.split(b" ", 4)[3]) for line in lines[first:] if line.split(b" ", 4)[3] != b"batch")
    kept = lines[:first]
    while kept and kept[-1].split(b" ", 4)[3] == b"batch":
        kept.pop()  # the fact's other rows: it comes whole by catch-up
    position = PositionCommand(stream_name, writer, token, new).to_line().encode()
    return [*kept, position], OversizedLine(token, len(lines[first]))


def build_counts(lines: list[str]) -> dict[str, int]:
    """Commands per name of :func:`build_lines`' output, without reading every line: RDATA
    lines, then at most one POSITION, last."""
    positions = 1 if lines and lines[-1].startswith("POSITION ") else 0
    counts = {"RDATA": len(lines) - positions, "POSITION": positions}
    return {name: n for name, n in counts.items() if n}


def _run_counts(lines: list[bytes]) -> dict[str, int]:
    """:func:`build_counts` of encoded lines."""
    positions = 1 if lines and lines[-1].startswith(b"POSITION ") else 0
    counts = {"RDATA": len(lines) - positions, "POSITION": positions}
    return {name: n for name, n in counts.items() if n}


@dataclass(frozen=True, slots=True)
class WriterRun:
    """One writer's lines on one stream covering ``(prev, new]``, as its streamer made them:
    RDATA in token order (``batch`` rows before their fact's token line), with a
    ``POSITION stream writer a b`` (``prev <= a < b <= new``) wherever the position moved past
    the last row (consecutive advances may be coalesced into one run). ``counts``: commands
    per name in ``data``.

    What a reader needs to take the lines apart without parsing them: whose they are and what
    range they cover (the legacy rewrite keeps or drops a whole run by it).
    """

    stream: str
    writer: str
    prev: int
    new: int
    data: bytes
    counts: Mapping[str, int]

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> list[bytes]:
        """Each line of ``data``, without its newline (the Synapse channel publishes them one
        by one)."""
        return self.data.split(b"\n")[:-1]

    def __add__(self, later: WriterRun) -> WriterRun:
        """This run and the same writer's next one as one run (``later`` starts where this
        one ends)."""
        if (later.stream, later.writer) != (self.stream, self.writer):
            raise ValueError(f"runs of different writers: {self.stream}/{self.writer}, {later.stream}/{later.writer}")
        return WriterRun(self.stream, self.writer, self.prev, later.new, self.data + later.data,
                         add_counts(self.counts, later.counts))

    def to_message(self) -> dict[str, Any]:
        """The run as the channel-layer message a streamer publishes on ``replication.lines``
        (its one serialized form: the layer's serializer makes the bytes)."""
        return {"type": RUN_MESSAGE_TYPE, "stream": self.stream, "writer": self.writer, "prev": self.prev,
                "new": self.new, "data": self.data, "count": self.count, "counts": self.counts}

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> WriterRun:
        """The run a ``replication.lines`` message carries. Raises ``KeyError``, ``TypeError``
        or ``ValueError`` on a message that is not one."""
        data = message["data"]
        if type(data) is not bytes:
            raise TypeError(f"data is {type(data).__name__}, not bytes")
        counts = message.get("counts") or counts_of(data.decode().splitlines())
        return cls(str(message["stream"]), str(message["writer"]), int(message["prev"]), int(message["new"]),
                   data, counts)


class EncodedRun(NamedTuple):
    """:func:`encode_run`'s answer: the run, its lines one by one (what the Synapse channel
    publishes, without splitting ``run.data`` again), and the line kept back, if any."""

    run: WriterRun
    lines: list[bytes]
    oversized: OversizedLine | None


def encode_run(stream_name: str, writer: str, prev: int, new: int,
               facts: Sequence[tuple[int, Sequence[Any]]]) -> EncodedRun:
    """A writer's ``facts`` (wire tokens, ascending) covering ``(prev, new]`` as one run,
    encoded once; and the line kept back as too long for a peer (:func:`fit_lines`), if any."""
    lines, oversized = fit_lines(stream_name, writer, prev, new, build_line_bytes(stream_name, writer, prev, new, facts))
    run = WriterRun(stream_name, writer, prev, new, b"\n".join(lines) + b"\n", _run_counts(lines))
    return EncodedRun(run, lines, oversized)


#: What a batch's lines are, in order: whole writer runs, or single commands (repairs, the
#: embedded scan's RDATA). Their encoded lines, concatenated, are the batch's ``data``.
BatchPart = WriterRun | Command


@dataclass(frozen=True, slots=True)
class LineBatch:
    """``data``: whole lines, each ending with ``\\n``; ``counts``: commands per name in it;
    ``parts``: what ``data`` is, as data (writer runs and commands, in order), for readers that
    need more than the bytes (the legacy rewrite); empty for lines already rewritten."""

    data: bytes
    counts: Mapping[str, int]
    parts: tuple[BatchPart, ...] = ()

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    @classmethod
    def of(cls, lines: list[str], counts: Mapping[str, int] | None = None) -> LineBatch:
        if not lines:
            return cls(b"", {})
        return cls(("\n".join(lines) + "\n").encode(), counts_of(lines) if counts is None else counts)

    @classmethod
    def of_run(cls, run: WriterRun) -> LineBatch:
        return cls(run.data, run.counts, (run,))

    @classmethod
    def of_commands(cls, cmds: Sequence[Command], lines: Sequence[str] | None = None) -> LineBatch:
        """``cmds`` as lines (``lines``: their ``to_line()``, if already made)."""
        if not cmds:
            return cls(b"", {})
        counts: dict[str, int] = {}
        for cmd in cmds:
            counts[cmd.NAME] = counts.get(cmd.NAME, 0) + 1
        text = [cmd.to_line() for cmd in cmds] if lines is None else lines
        return cls(("\n".join(text) + "\n").encode(), counts, tuple(cmds))

    def __add__(self, other: LineBatch) -> LineBatch:
        return LineBatch(self.data + other.data, add_counts(self.counts, other.counts), self.parts + other.parts)
