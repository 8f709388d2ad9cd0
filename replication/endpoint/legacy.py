"""The older protocol generation (``REPLICATE <stream|ALL> <token|NOW>``, RDATA without a
writer name): a connection that subscribes this way is streamed from its token, read from
the backing tables, then live, in that format. See docs/replication.md.

Netcat users get a working session::

    $ nc 127.0.0.1 9092
    SERVER localhost
    PING 1700000000000
    REPLICATE receipts 0
    RDATA receipts 2 ["!room1:localhost","m.read",...]
    POSITION receipts 2

A history read is the most expensive thing a peer can ask for, so (docs/security.md) it is a
:class:`HistoryRead` task of its own, read :data:`PAGE_ROWS` rows at a time: a page is read
only once the connection has written the previous one (back-pressure), paid for from the
connection's command budget (``ratelimit.HISTORY_PAGE_COST``), and read one at a time in
the whole endpoint, at most ``REPLICATION_HISTORY_PAGE_RATE`` pages a second in all. A connection has at most one read
per stream: a second ``REPLICATE`` of the same stream replaces it (as Synapse's old server
re-subscribed). A connection that goes cancels its reads.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from asgiref.sync import sync_to_async

from replication.endpoint.connection_records import ConnectionInfo
from replication.endpoint.ratelimit import HISTORY_PAGE_COST, TokenBucket
from replication.protocol.commands import (
    MAX_LINE_LENGTH,
    Command,
    ErrorCommand,
    LegacyPositionCommand,
    LegacyRdataCommand,
    LegacyReplicateCommand,
    batch_updates,
)
from replication.protocol.legacy_rewrite import to_legacy
from replication.protocol.line_batch import BatchPart, LineBatch
from streams.conf import repl_setting
from streams.registry import STREAMS, StreamSpec
from streams.updates_since import get_updates_since


class Subscriber(Protocol):
    """A connection as a legacy subscription uses it (the endpoint's consumer)."""

    info: ConnectionInfo
    legacy_reads: dict[str, Any]  #: stream -> its HistoryRead in flight

    async def send_commands(self, cmds: list[Command]) -> None: ...
    async def send_lines(self, batch: LineBatch) -> None: ...
    async def writable(self) -> None: ...
    async def pay(self, cost: int) -> None: ...
    async def error_and_close(self, text: str, *, reason: str) -> None: ...

logger = logging.getLogger(__name__)

#: Rows read per writer and page: what a history read holds in memory at once.
PAGE_ROWS = 500
#: Live lines kept for a stream while its history is read (sent after it). Past this, they are
#: dropped and the read goes on to the stream's newer position instead.
MAX_BUFFERED_LINES = 10_000


@dataclass
class _WriterCursor:
    """How far one writer's rows were read (``cursor``) towards ``target``, and the rows read
    but not sent yet (above what every other writer was read to)."""

    cursor: int
    target: int
    carry: list[tuple[int, Any]] = field(default_factory=list)


class HistoryRead:
    """One connection's read of stream ``name`` from ``start`` to where its writers stood
    (``upto``), and the live lines that arrived meanwhile."""

    def __init__(self, name: str, start: int, positions: dict[str, int]) -> None:
        self.name = name
        self.start = start
        self.writers: dict[str, _WriterCursor] = {}
        self.upto = start
        self.buffer: list[bytes] = []
        self.buffered = 0
        self.overflowed = False
        self.pages = 0
        self.task: asyncio.Task[None] | None = None
        self.extend(positions)

    def extend(self, positions: dict[str, int]) -> None:
        """Read on to these writer positions (a new read target)."""
        for writer, token in positions.items():
            current = self.writers.get(writer)
            if current is None:
                self.writers[writer] = _WriterCursor(self.start, max(self.start, token))
            else:
                current.target = max(current.target, token)
        self.upto = max([self.start, *(c.target for c in self.writers.values())])
        self.buffer, self.buffered, self.overflowed = [], 0, False

    @property
    def done(self) -> bool:
        return all(c.cursor >= c.target and not c.carry for c in self.writers.values())

    def offer(self, parts: Iterable[BatchPart]) -> None:
        """A live batch arrived while reading: keep its lines of this stream above ``upto``."""
        if self.overflowed:
            return
        batch = to_legacy(parts, {self.name: str(self.upto)})
        count = batch.count
        if not count:
            return
        if self.buffered + count > MAX_BUFFERED_LINES:
            self.buffer, self.buffered, self.overflowed = [], 0, True
            return
        self.buffer.append(batch.data)
        self.buffered += count

    def read_page(self, spec: StreamSpec, using: str, limit: int = PAGE_ROWS) -> LineBatch:
        """The next page as legacy RDATA lines (blocking: runs in a thread). Rows of all
        writers are merged by token: only rows up to what every unfinished writer was read to
        are sent; the others wait in their writer's ``carry``."""
        for writer, c in self.writers.items():
            if not c.carry and c.cursor < c.target:
                result = get_updates_since(spec, writer, c.cursor, c.target, limit=limit, using=using)
                c.carry, c.cursor = result.updates, result.upto_token
        unfinished = [c.cursor for c in self.writers.values() if c.cursor < c.target]
        bound = min(unfinished) if unfinished else None
        rows: list[tuple[int, Any]] = []
        for c in self.writers.values():
            if bound is None:
                rows.extend(c.carry)
                c.carry = []
            else:
                rows.extend(r for r in c.carry if r[0] <= bound)
                c.carry = [r for r in c.carry if r[0] > bound]
        rows.sort(key=lambda item: item[0])  # stable: a fact's rows stay in table order
        self.pages += 1
        updates = batch_updates(rows)
        lines = [LegacyRdataCommand(self.name, token, row).to_line() for token, row in updates]
        if any(len(line) > MAX_LINE_LENGTH // 4 for line in lines):
            lines = self._without_oversized_facts(updates, lines)
        return LineBatch.of(lines, {"RDATA": len(lines)})

    def _without_oversized_facts(self, updates: list[tuple[int | None, Any]], lines: list[str]) -> list[str]:
        """The facts whose every line fits :data:`MAX_LINE_LENGTH` bytes: a peer hangs up on a
        longer one, and this generation has no catch-up to send the fact by instead."""
        out: list[str] = []
        fact: list[str] = []
        for (token, _), line in zip(updates, lines):
            fact.append(line)
            if token is None:
                continue
            if all(len(x.encode()) <= MAX_LINE_LENGTH for x in fact):
                out += fact
            else:
                logger.error("legacy history read of %s: fact %d has a line over %d bytes: not sent",
                             self.name, token, MAX_LINE_LENGTH)
            fact = []
        return out


class LegacyStreamer:
    """The endpoint's legacy subscriptions: starts, replaces and cancels history reads, and
    counts them for operators and tests (``counters``)."""

    def __init__(self, positions: Callable[[], dict[tuple[str, str], int]], *, using: str = "default",
                 page_rate: float | None = None) -> None:

        #: where every (stream, writer) stands now: a read goes up to there (the relay's positions)
        self.positions = positions
        self.using = using
        rate = float(repl_setting("REPLICATION_HISTORY_PAGE_RATE")) if page_rate is None else page_rate
        #: Pages of the whole endpoint: the CPU all history reads together may take, whatever
        #: the kernel's send buffers absorb before back-pressure starts (MiBs per connection).
        self.page_budget = TokenBucket(rate, max(1, int(rate)), time.monotonic())
        self._slots: asyncio.Semaphore | None = None
        #: reads started = replaced + cancelled (the connection went) + completed + failed (+ active);
        #: pages and rows read; restarted (read on after too many live lines came meanwhile)
        self.counters: collections.Counter[str] = collections.Counter()
        self.active = 0
        self.most_active = 0

    @property
    def slots(self) -> asyncio.Semaphore:
        """One page read at a time, waiting readers served in turn (FIFO)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(1)
        return self._slots

    async def subscribe(self, consumer: Subscriber, cmd: LegacyReplicateCommand) -> None:
        names = [n for n, s in STREAMS.items() if s.db_backed] if cmd.stream_name == "ALL" else [cmd.stream_name]
        spec = STREAMS.get(cmd.stream_name)
        if cmd.stream_name != "ALL" and (spec is None or not spec.db_backed):
            shown = cmd.stream_name if len(cmd.stream_name) <= 40 else cmd.stream_name[:40] + "..."
            await consumer.send_commands([ErrorCommand(f"unknown stream: {shown!r}")])
            return
        # No await from here to the end of the loop: a batch the relay sends after this
        # snapshot of positions reaches either the live subscription or the read's buffer.
        positions = self.positions()
        out: list[Command] = []
        for name in names:
            writers = {w: t for (s, w), t in positions.items() if s == name}
            if self.stop(consumer, name):
                self.counters["replaced"] += 1
            if cmd.token == "NOW":
                upto = max(writers.values(), default=0)
                consumer.info.legacy_streams[name] = str(upto)
                out.append(LegacyPositionCommand(name, upto))
            else:
                consumer.info.legacy_streams.pop(name, None)
                read = HistoryRead(name, int(cmd.token), writers)
                consumer.legacy_reads[name] = read
                read.task = asyncio.create_task(self._run(consumer, read), name=f"legacy-{name}")
                self.counters["started"] += 1
        await consumer.send_commands(out)

    def stop(self, consumer: Subscriber, name: str) -> bool:
        """Cancel ``consumer``'s read of ``name``, if any (True if there was one)."""
        read = consumer.legacy_reads.pop(name, None)
        if read is None:
            return False
        if read.task is not None:
            read.task.cancel()
        return True

    def stop_all(self, consumer: Subscriber) -> None:
        """The connection went: its reads end with it."""
        for name in list(consumer.legacy_reads):
            if self.stop(consumer, name):
                self.counters["cancelled"] += 1

    async def _run(self, consumer: Subscriber, read: HistoryRead) -> None:
        spec = STREAMS[read.name]
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            while True:
                while not read.done:
                    await consumer.writable()  # the previous page has left (back-pressure)
                    await consumer.pay(HISTORY_PAGE_COST)
                    async with self.slots:
                        while not self.page_budget.take(time.monotonic()):
                            await asyncio.sleep(self.page_budget.wait_time(time.monotonic()))
                        page = await sync_to_async(read.read_page, thread_sensitive=False)(spec, self.using)
                    self.counters["pages"] += 1
                    if page.count:
                        self.counters["rows"] += page.count
                        await consumer.send_lines(page)
                if not read.overflowed:
                    break
                # More arrived meanwhile than we keep: read on to where the writers are now.
                self.counters["restarted"] += 1
                read.extend({w: t for (s, w), t in self.positions().items() if s == read.name})
            # Caught up: the position, the lines that arrived meanwhile, then live (no await
            # between taking the buffer and going live).
            if consumer.legacy_reads.get(read.name) is not read:
                return
            del consumer.legacy_reads[read.name]
            consumer.info.legacy_streams[read.name] = str(read.upto)
            data = (LegacyPositionCommand(read.name, read.upto).to_line() + "\n").encode() + b"".join(read.buffer)
            self.counters["completed"] += 1
            # the buffered lines are RDATA and POSITION, counted as such
            await consumer.send_lines(LineBatch(data, {"POSITION": 1, "RDATA": read.buffered}))
        except Exception:
            self.counters["failed"] += 1
            logger.exception("legacy history read of %s failed", read.name)
            await consumer.error_and_close("Internal error reading history", reason="history read failed")
        finally:
            self.active -= 1
