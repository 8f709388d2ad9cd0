"""The embedded default's way for an endpoint to see every local writer: read committed rows
from the database and send them as RDATA. See docs/replication.md ("The embedded default").

On SQLite with no Redis there is no channel layer between processes: ``write_facts`` in
another shell, the demo child and the service itself all write (often under the same
``INSTANCE_NAME``) into one database file. A position alone would make every worker fetch
the rows over HTTP, and tell a legacy subscriber it is up to date when it is not. So the
endpoint reads the rows itself, up to a *safe bound* per stream, and announces nothing it
has not sent.

The safe bound. A SQLite writer reserves IDs in one transaction that bumps the ID table and
records a ``stream_reservations`` row; it commits its rows, then deletes the reservation. So
in any one read, every ID up to the ID table's value that no reservation holds is finished
(its rows committed, or rolled back for good). The bound is one below the lowest ID still
reserved (by a live process: a killed writer's SQLite transaction is rolled back with it),
or the ID table's value. Rows up to it can be read once and never appear later.

:class:`ScanState` is the bookkeeping (no I/O); :func:`read_bounds` and
:func:`read_initial_writers` read the database.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from replication.protocol.commands import MAX_LINE_LENGTH, PositionCommand, RdataCommand
from streams.id_store import pid_alive
from streams.models import StreamPosition
from streams.registry import STREAMS, StreamSpec

#: Tokens read per query: bounds the work of one step, so the event loop stays responsive
#: after a large write from another shell.
SCAN_PAGE_TOKENS = 1000


def safe_bounds(last_ids: dict[str, int], pending: Iterable[tuple[str, Iterable[int], int | None]],
                *, alive: Callable[[int | None], bool] = pid_alive) -> dict[str, int]:
    """Per stream: the highest wire token up to which every ID is finished.

    ``last_ids``: per stream, the last ID its ID table handed out; ``pending``: ``(stream,
    ids, pid)`` per reservation. Reservations of dead processes are ignored: on SQLite their
    transactions rolled back with them."""
    bounds = dict(last_ids)
    for stream, ids, pid in pending:
        if stream not in bounds or not alive(pid):
            continue
        ids = [int(i) for i in ids]
        if ids:
            bounds[stream] = min(bounds[stream], min(ids) - 1)
    return bounds


def read_bounds(using: str = "default") -> dict[str, int]:
    """:func:`safe_bounds` from one read transaction of the database."""
    from django.db import connections, transaction

    sequences = {spec.sequence: name for name, spec in STREAMS.items() if spec.db_backed}
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute("SELECT name, last_value FROM stream_sequences")
        last_ids = {sequences[name]: int(value) for name, value in cursor.fetchall() if name in sequences}
        cursor.execute("SELECT stream_name, stream_ids, pid FROM stream_reservations")
        pending = [(stream, json.loads(ids) if isinstance(ids, str) else ids, pid)
                   for stream, ids, pid in cursor.fetchall()]
    for name in sequences.values():
        last_ids.setdefault(name, 1)  # not created yet: ID 1 counts as persisted
    return safe_bounds(last_ids, pending)


def read_initial_writers(bounds: dict[str, int], using: str = "default") -> dict[tuple[str, str], int]:
    """Per (stream, writer): its last token at or below the stream's bound, from its rows and
    its recorded position (``caches`` records none: any process may write it)."""
    from django.db.models import Max, Min

    result: dict[tuple[str, str], int] = {}
    for name, bound in bounds.items():
        spec = STREAMS[name]
        signs = spec.direction
        for table in spec.tables:
            model, id_field = table.model, table.model.STREAM_ID_FIELD
            # events and backfill share a table: forward IDs are positive, backwards negative.
            last = (Min if signs.backwards else Max)(id_field)
            qs = (model.objects.using(using).filter(**signs.lookups(id_field, 0, bound))
                  .values("instance_name").annotate(last=last))
            for row in qs:
                key = (name, row["instance_name"])
                result[key] = max(result.get(key, 0), signs.to_wire(row["last"]))
    for row in StreamPosition.objects.using(using).all():
        recorded = STREAMS.get(row.stream_name)
        if recorded is None or not recorded.db_backed or row.stream_name not in bounds:
            continue
        key = (row.stream_name, row.instance_name)
        token = min(recorded.to_wire(row.stream_id), bounds[row.stream_name])
        result[key] = max(result.get(key, 0), token)
    return result


@dataclass
class ScanState:
    """What the endpoint has sent: per stream the bound up to which every writer's rows went
    out (``scanned``), per (stream, writer) the last token sent (``last_sent``)."""

    scanned: dict[str, int] = field(default_factory=dict)
    last_sent: dict[tuple[str, str], int] = field(default_factory=dict)

    def next_range(self, stream: str, bound: int) -> tuple[int, int] | None:
        """The next range of ``stream`` to read, at most :data:`SCAN_PAGE_TOKENS` long."""
        lo = self.scanned.get(stream)
        if lo is None or bound <= lo:
            return None
        return lo, min(bound, lo + SCAN_PAGE_TOKENS)

    def commands(self, spec: StreamSpec, lo: int, hi: int,
                 rows: list[tuple[str, int, list[Any]]]) -> list[RdataCommand | PositionCommand]:
        """The commands for ``rows`` (every writer's, tokens in ``(lo, hi]``, in order) and the
        bookkeeping: RDATA in token order (``batch`` for all rows of a fact but its last); a
        writer seen for the first time is first announced with ``POSITION s w 0 lo`` (it has
        nothing at or below ``lo``: everything there was read), so a worker takes its RDATA
        without a catch-up."""
        stream = spec.name
        out: list[RdataCommand | PositionCommand] = []
        i = 0
        while i < len(rows):
            writer, token, _ = rows[i]
            j = i
            while j < len(rows) and rows[j][1] == token:
                j += 1
            key = (stream, writer)
            last = self.last_sent.get(key)
            if last is None:
                out.append(PositionCommand(stream, writer, 0, lo))
                last = self.last_sent[key] = lo
            if token > last:
                for _, _, row in rows[i:j - 1]:
                    out.append(RdataCommand(stream, writer, None, row))
                out.append(RdataCommand(stream, writer, token, rows[j - 1][2]))
                self.last_sent[key] = token
            i = j
        self.scanned[stream] = hi
        return out


def fit_commands(cmds: list[RdataCommand | PositionCommand],
                 lines: list[str]) -> tuple[list[RdataCommand | PositionCommand], list[str], list[int]]:
    """``cmds`` and their ``lines``, each fact with a line over :data:`MAX_LINE_LENGTH` bytes
    replaced by ``POSITION s w t t`` (``t`` its token), and the tokens so replaced.

    A peer hangs up on a longer line; the POSITION is above what a worker has, so the worker
    fetches the fact from the catch-up endpoint (an HTTP answer has no line limit) and goes on
    with the RDATA after it. Lines of at most ``MAX_LINE_LENGTH // 4`` characters always fit
    (UTF-8 takes at most 4 bytes a character): only longer ones are measured."""
    safe = MAX_LINE_LENGTH // 4
    if all(len(line) <= safe for line in lines):
        return cmds, lines, []
    out_cmds: list[RdataCommand | PositionCommand] = []
    out_lines: list[str] = []
    cut: list[int] = []
    fact: list[int] = []  # indexes of the current fact's batch rows
    for i, cmd in enumerate(cmds):
        if type(cmd) is not RdataCommand:
            out_cmds.append(cmd)
            out_lines.append(lines[i])
            continue
        fact.append(i)
        if cmd.token is None:
            continue
        if any(len(lines[k]) > safe and len(lines[k].encode()) > MAX_LINE_LENGTH for k in fact):
            position = PositionCommand(cmd.stream_name, cmd.instance_name, cmd.token, cmd.token)
            out_cmds.append(position)
            out_lines.append(position.to_line())
            cut.append(cmd.token)
        else:
            out_cmds.extend(cmds[k] for k in fact)
            out_lines.extend(lines[k] for k in fact)
        fact = []
    return out_cmds, out_lines, cut
