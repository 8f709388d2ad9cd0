"""Outbound lines as one value: the encoded bytes and how many of each command they hold.

Every path that writes to a replication connection hands the consumer a :class:`LineBatch`
(the relay's batches of a writer's RDATA, its repairs, the embedded scan, a legacy history
page, a command relayed from another worker), and the connection state machine accepts it
(:meth:`ReplicationConnection.send_batch`): so relayed bytes move its ``last_sent`` (the server
pings only after silence, as Synapse's does) and the counters come from the counts, never from
sniffing bytes. The counts are known where the lines are made: the writer counts once, not
each of an endpoint's connections.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from streams.replication.protocol.commands import Command


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


@dataclass(frozen=True, slots=True)
class LineBatch:
    """``data``: whole lines, each ending with ``\\n``; ``counts``: commands per name in it."""

    data: bytes
    counts: Mapping[str, int]

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    @classmethod
    def of(cls, lines: list[str], counts: Mapping[str, int] | None = None) -> LineBatch:
        if not lines:
            return cls(b"", {})
        return cls(("\n".join(lines) + "\n").encode(), counts_of(lines) if counts is None else counts)

    def __add__(self, other: LineBatch) -> LineBatch:
        return LineBatch(self.data + other.data, add_counts(self.counts, other.counts))


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


#: What a batch's lines are, in order: whole writer runs, or single commands (repairs, the
#: embedded scan's RDATA). Their encoded lines, concatenated, are the batch's ``data``.
BatchPart = WriterRun | Command
