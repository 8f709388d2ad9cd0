"""Several event writer processes for ``bench_storage``: rooms sharded over them.

Synapse scales event persistence by giving each room to one of several event persisters
(``stream_writers: events: [...]``, a room ID's hash picks the writer), and so does
``STREAM_WRITERS=events=w1,w2`` here: each writer process persists whole batches of its own
rooms, all of them writing one ``events`` stream. ``route`` is the router (pure: the
generator's batches in, each writer's batches out, in the order the generator made each
room's events); :class:`EventWriterPool` runs the writer processes, each with its own
Django, persister and caches, a few batches queued ahead of each.
"""
from __future__ import annotations

import os
import time
import traceback
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator

if TYPE_CHECKING:  # (imported when used: the writer processes import this before Django is set up)
    from rooms.storage.generator import Batch

#: batches queued ahead of each writer: enough that one writer's slower batch (a big room's
#: fork) does not leave the other waiting for the router
QUEUED_PER_WRITER = 4


def shard_of(room: str, writers: int) -> int:
    """The writer of a room (a stable hash of its ID, as Synapse's stream writers use)."""
    return zlib.crc32(room.encode()) % writers


def route(batches: Iterable[Batch], writers: int, size: int) -> Iterator[tuple[int, Batch]]:
    """Each writer's batches, ``(writer, batch)``: the items of its rooms, ``size`` at most
    per batch, in the generator's order. A writer's pending items go out before a batch of
    the other kind (live then backfill: never one transaction of both), and at the end."""
    from rooms.storage.generator import Batch

    pending: list[Batch] = [Batch([]) for _ in range(writers)]
    for batch in batches:
        if len(batch.rooms) != len(batch.items):
            raise ValueError(f"a batch of {len(batch.items)} items names {len(batch.rooms)} rooms")
        for item, room in zip(batch.items, batch.rooms):
            w = shard_of(room, writers)
            out = pending[w]
            if out.items and out.backfill != batch.backfill:
                yield w, out
                out = pending[w] = Batch([])
            out.backfill = batch.backfill
            out.items.append(item)
            out.rooms.append(room)
            if len(out.items) >= size:
                yield w, out
                pending[w] = Batch([])
    for w, out in enumerate(pending):
        if out.items:
            yield w, out


def configure_persister(persister: Any, *, freeze_every: int | None, bulk_gc: str | None, gc_young: int | None,
                        cache_scale: float, room_cache: int | None) -> None:
    """A bulk-loading persister as ``bench_storage``'s options set it (in its process or a
    writer process)."""
    from rooms.storage.persist import FREEZE_EVERY

    persister.freeze_every = FREEZE_EVERY if freeze_every is None else freeze_every
    if bulk_gc is not None:
        persister.bulk_gc = bulk_gc
    if gc_young is not None:
        persister.gc_threshold = (gc_young, *persister.gc_threshold[1:])
    if cache_scale != 1.0:
        persister.scale_caches(cache_scale)
    if room_cache is not None:
        persister.rooms.size = room_cache


def writer_names(writers: int) -> list[str]:
    return [f"w{i + 1}" for i in range(writers)]


def stream_writers(writers: int) -> str:
    """``STREAM_WRITERS`` for the benchmark's processes: this one (``master``: the baseline,
    the live traffic) and the writer processes."""
    return "events=" + ",".join(["master", *writer_names(writers)])


@dataclass
class Committed:
    """One batch a writer committed: its events, its wall and CPU seconds inside
    ``persist_events`` (the writer's process, its database backend)."""
    writer: int
    events: int
    seconds: float
    cpu_here: float
    cpu_database: float


def _writer_main(conn: Any, instance: str, options: dict[str, Any]) -> None:
    """A writer process: Django as ``instance``, then persist what arrives until ``None``."""
    try:
        os.environ["INSTANCE_NAME"] = instance
        import django

        django.setup()
        from benchmarks.bench_storage import backend_cpu_seconds, rss_mb
        from rooms.storage import persist_events
        from rooms.storage.persist import persister_for
        from streams.runtime import runtime

        rt = runtime()
        persister = persister_for(rt)
        configure_persister(persister, **options)
        conn.send(("ready", persister.rooms.size))
        while (job := conn.recv()) is not None:
            backfill, items = job
            t, cpu0, db0 = time.perf_counter(), time.process_time(), backend_cpu_seconds()
            persist_events(items, backfill=backfill, runtime=rt)
            conn.send(("done", len(items), time.perf_counter() - t, time.process_time() - cpu0,
                       backend_cpu_seconds() - db0))
        persister.end_bulk()
        rt.close()
        conn.send(("closed", rss_mb()))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise


class WriterFailed(RuntimeError):
    pass


class EventWriterPool:
    """``writers`` event writer processes (``w1``, ``w2``, ...), started fresh (spawned: no
    state shared with this process), each fed its batches through a pipe."""

    def __init__(self, writers: int, options: dict[str, Any]) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.names = writer_names(writers)
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._queued = [0] * writers
        self.committed: list[Committed] = []
        self.rss_mb: list[float] = [0.0] * writers
        #: a writer failed or exited: :meth:`close` stops the others without waiting for them
        self.failed = False
        for name in self.names:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_writer_main, args=(child, name, options), name=f"event writer {name}",
                               daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self.room_cache = [self._expect(i, "ready")[1] for i in range(writers)]

    def _expect(self, i: int, kind: str) -> tuple:
        try:
            msg = self._conns[i].recv()
        except EOFError:
            self.failed = True
            raise WriterFailed(f"event writer {self.names[i]} exited (status {self._procs[i].exitcode})") from None
        if msg[0] != kind:
            self.failed = True
            if msg[0] == "error":
                raise WriterFailed(f"event writer {self.names[i]} failed:\n{msg[1]}")
            raise WriterFailed(f"event writer {self.names[i]} said {msg[0]!r}, expected {kind!r}")
        return msg

    def _take(self, i: int) -> None:
        _, n, seconds, cpu_here, cpu_database = self._expect(i, "done")
        self._queued[i] -= 1
        self.committed.append(Committed(i, n, seconds, cpu_here, cpu_database))

    def submit(self, writer: int, batch: Batch) -> None:
        """Queue ``batch`` to ``writer``, first waiting while it has :data:`QUEUED_PER_WRITER`."""
        self.poll()
        while self._queued[writer] >= QUEUED_PER_WRITER:
            self._take(writer)
        self._conns[writer].send((batch.backfill, batch.items))
        self._queued[writer] += 1

    def poll(self) -> None:
        """Take every commit reported so far, without waiting."""
        from multiprocessing.connection import wait

        for conn in wait([c for c, q in zip(self._conns, self._queued) if q], timeout=0):
            i = self._conns.index(conn)
            while self._queued[i] and conn.poll():
                self._take(i)

    def drain(self) -> None:
        """Wait until every queued batch is committed."""
        for i in range(len(self._conns)):
            while self._queued[i]:
                self._take(i)

    def close(self) -> None:
        """Stop the writers once their queues are done (their RSS in :attr:`rss_mb`); after
        a failure, stop them at once (what they had queued is rolled back or committed, as
        a killed writer's)."""
        try:
            if not self.failed:
                self.drain()
                for conn in self._conns:
                    conn.send(None)
                for i in range(len(self._conns)):
                    self.rss_mb[i] = self._expect(i, "closed")[1]
        finally:
            for proc in self._procs:
                if self.failed:
                    proc.terminate()
                proc.join(timeout=60)
                if proc.is_alive():
                    proc.kill()
