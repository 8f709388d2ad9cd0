"""Room event storage: persist rate, state-at-event, state storage, syncs and pagination.

    .venv/bin/python benchmarks/bench_storage.py [--events N] [--rooms R] [--users U] [--quick] [--sqlite]
                                                 [--data-dir D [--stop-after N] [--read-partial]]
                                                 [--freeze-every N] [--room-cache N] [--cache-scale F]

Starts a throwaway PostgreSQL (``PostgresServer(fast=False)``: fsync on, as a real server),
migrates a fresh database, then on that one server:

* **persist**: ``generate_rooms``' dataset (rooms.storage.generator: big churny rooms,
  small rooms, four visibilities, invites, redactions, backfill) through ``persist_events``
  in batches; events/s counts only the time inside ``persist_events``, printed per slice
  (100,000 events at full size) so that a cost growing with the tables shows, and per million
  events with the process's memory and the database's size; the CPU per event inside
  ``persist_events``, here and in the database's backend, is printed beside it (steadier than
  events/s on a shared machine). **Baseline**, same
  run: the same number of bare ``events`` rows written with ``StreamWriter.append`` (what
  ``write_facts events`` does: no DAG, state or visibility), at the same batch size.
* **state at event**: p50/p99 of ``state_at_event`` for random events, cold (caches dropped
  before each call: a delta-chain walk in PostgreSQL) and warm; **state storage**: bytes of
  the three state-group tables against the same groups stored as full snapshots (the sum of
  every group's state size, estimated from a random sample of groups, times the measured
  bytes per row).
* **initial sync** (20 events x 100 rooms) for the users in the most rooms, **incremental
  sync** since a token taken before a last run of live traffic (1% more events, at least 2,000
  or the dataset's size, persisted with the dataset), and after an absence (a token a tenth of
  the stream back, no goal), **back-pagination** (20 events from a random point), p50/p99 each,
  visibility filtered; **database size** on disk, per million events.

``--event-writers N`` persists the dataset with N event writer processes instead of this one
(``STREAM_WRITERS=events=master,w1,...``: each room's events go to one writer, chosen by a hash
of the room as Synapse's sharded event persisters do; ``_event_writers``), all at once; the rate
is then the dataset's events over the phase's wall time, generating and routing included, and
each writer's own share, rate and CPU per event are printed. Such a build, once stopped, is not
continued.

``--data-dir D`` keeps the PostgreSQL cluster in ``D`` (as ``bench_jobs`` does). A build there
is recorded in ``D/build.json`` after every committed batch (the arguments, the phase, batches
and events persisted, the time and CPU inside ``persist_events``, every finished million's and
slice's rate with the load average seen during it and the sessions that built it): a run
stopped by ``--stop-after N`` (N of the dataset's events persisted), SIGTERM (after the batch
in flight) or a kill is continued by the next run with the same figures, which regenerates
the stored events (the generator is deterministic for a seed), skips them and persists the
rest; the stored count is checked against the database's first, and a record that does not
match (another dataset, more events than the database holds, not a whole number of batches)
is refused with exit status 2 before anything is written. The per-million table printed at
the end covers the whole build, earlier sessions' millions marked as such. The reads run once
the build is complete (``--read-partial``: on the partial dataset, labelled so). A finished
build leaves ``dataset.json`` (events, rooms, users, seed, batch, the incremental sync's
token): the next run with the same figures reuses it, persist skipped, only the reads
measured (in a fresh process: the reads' caches start empty).

The persister freezes its objects for the garbage collector every ``--freeze-every`` batches
(default ``persist.FREEZE_EVERY``, as ``generate_rooms``; 0: never), and the collector's time
during the persist phase is printed.

Prints the goals (persist >= 2,000 events/s sustained, initial sync p99 <= 50 ms,
incremental sync p99 <= 30 ms, back-pagination p99 <= 10 ms, state at event cold p99 <= 50 ms,
state storage <= 0.05 of snapshots) beside the figures; exit status 0 either way. The goals are PostgreSQL's;
``--sqlite`` runs the same on a throwaway SQLite file (the embedded default) instead.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._build_record import BuildRecord, BuildRefused, skip_stored  # noqa: E402
from benchmarks._event_writers import EventWriterPool, configure_persister, route, stream_writers  # noqa: E402
from benchmarks._machine import cpu_description  # noqa: E402
from benchmarks._setup import add_pg_settings_arguments, pg_settings_of  # noqa: E402


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def backend_cpu_seconds() -> float:
    """CPU seconds the database server spent for this process's connection so far (its
    backend process on this machine; 0 on SQLite, which runs in this process)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return 0.0
    with connection.cursor() as c:
        c.execute("SELECT pg_backend_pid()")
        pid = c.fetchone()[0]
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: CPU per call of the last :func:`timed` run, ms (this process, the database's backend)
last_cpu: tuple[float, float] = (0.0, 0.0)
#: the collector during the last :func:`timed` run: collections, their ms in all, the longest
last_gc: tuple[int, float, float] = (0, 0.0, 0.0)


def timed(fn, n: int, *, before=None) -> list[float]:
    """Wall ms of each of ``n`` calls (``before(i)``, if given, runs untimed before each).
    Also keeps the CPU per call (:data:`last_cpu`): on a shared machine the wall times follow
    the load, the CPU a call costs much less so; and the collector's pauses
    (:data:`last_gc`): a full collection lands inside one call."""
    import gc

    global last_cpu, last_gc
    pauses: list[float] = []
    started = [0.0]

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((time.perf_counter() - started[0]) * 1000)

    out = []
    gc.collect()  # what an earlier phase left for the collector is not this phase's pause
    gc.callbacks.append(watch)
    try:
        cpu0, backend0 = time.process_time(), backend_cpu_seconds()
        for i in range(n):
            if before is not None:
                before(i)
            t = time.perf_counter()
            fn(i)
            out.append((time.perf_counter() - t) * 1000)
        last_cpu = ((time.process_time() - cpu0) * 1000 / n, (backend_cpu_seconds() - backend0) * 1000 / n)
    finally:
        gc.callbacks.remove(watch)
    last_gc = (len(pauses), sum(pauses), max(pauses, default=0.0))
    return out


def fmt(ms: list[float]) -> str:
    return (f"p50 {pct(ms, 50):7.2f} ms   p99 {pct(ms, 99):7.2f} ms   (n={len(ms)}); "
            f"CPU per call {last_cpu[0]:.2f} ms here + {last_cpu[1]:.2f} ms database; "
            f"collector {last_gc[0]} runs, {last_gc[1]:.0f} ms, longest {last_gc[2]:.1f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=None, help="default 1,000,000 (--quick 30,000)")
    parser.add_argument("--rooms", type=int, default=None, help="default 10,000 (--quick 300)")
    parser.add_argument("--users", type=int, default=None, help="default 20,000 (--quick 1,000)")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--samples", type=int, default=None, help="timed calls per read (default 500, --quick 200)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sqlite", action="store_true", help="a throwaway SQLite file instead of PostgreSQL")
    parser.add_argument("--data-dir", help="keep the PostgreSQL cluster here; the next run with the same "
                                           "--events/--rooms/--users/--seed/--batch continues a partial build "
                                           "or, on a finished one, skips persist and measures the reads")
    parser.add_argument("--stop-after", type=int, default=None, metavar="N",
                        help="with --data-dir: stop the build once N of the dataset's events are persisted "
                             "(a later run continues it)")
    parser.add_argument("--read-partial", action="store_true",
                        help="measure the reads on a build that stopped before its end (labelled partial)")
    parser.add_argument("--freeze-every", type=int, default=None,
                        help="gc.freeze the persister's objects every N batches (default persist.FREEZE_EVERY, "
                             "as generate_rooms; 0: never)")
    parser.add_argument("--bulk-gc", choices=("freeze", "collect"), default=None,
                        help="how the freezing persister treats the collector (default persist.BULK_GC): "
                             "'freeze', automatic collection off and nothing collected; 'collect', raised "
                             "thresholds and a full collection before each freeze")
    parser.add_argument("--gc-young", type=int, default=None, metavar="N",
                        help="with --bulk-gc collect: the collector's youngest threshold (default "
                             "persist.BULK_GC_THRESHOLD's)")
    add_pg_settings_arguments(parser, kept="and kept in a build's record per session")
    parser.add_argument("--cache-scale", type=float, default=1.0,
                        help="every persister cache's bound times F (EventPersister.scale_caches; the defaults "
                             "fit ~20,000 active rooms)")
    parser.add_argument("--room-cache", type=int, default=None,
                        help="room contexts the persister keeps between batches (default its own, 20,000)")
    parser.add_argument("--event-writers", type=int, default=1, metavar="N",
                        help="persist the dataset with N event writer processes, each room's events by one "
                             "(STREAM_WRITERS=events=master,w1..wN; PostgreSQL only; such a build is not "
                             "continued once stopped)")
    args = parser.parse_args(argv)
    if args.event_writers < 1:
        parser.error(f"--event-writers must be 1 or more, not {args.event_writers}")
    if args.event_writers > 1 and args.sqlite:
        parser.error("--event-writers N: SQLite has one writer")
    if not args.cache_scale > 0:
        parser.error(f"--cache-scale must be above 0, not {args.cache_scale}")
    if args.stop_after is not None and (not args.data_dir or args.stop_after < 1):
        parser.error("--stop-after N needs --data-dir (a stopped build is continued from there) and N >= 1")
    events = args.events or (30_000 if args.quick else 1_000_000)
    rooms = args.rooms or (300 if args.quick else 10_000)
    users = args.users or (1_000 if args.quick else 20_000)
    samples = args.samples or (200 if args.quick else 500)

    from benchmarks._setup import migrated_database, migrated_sqlite_database

    pg_settings = pg_settings_of(args, parser)
    if pg_settings and args.sqlite:
        parser.error("--pg-set/--pg-tuned are PostgreSQL's settings: not with --sqlite")

    dataset = {"events": events, "rooms": rooms, "users": users, "seed": args.seed, "batch": args.batch}
    slice_size = 100_000 if events >= 500_000 else max(args.batch, events // 5)
    reused: dict | None = None
    record: BuildRecord | None = None
    if args.data_dir:
        if args.sqlite:
            parser.error("--data-dir keeps a PostgreSQL cluster: not with --sqlite")
        directory = Path(args.data_dir)
        try:
            stored = read_marker(directory)
            record = BuildRecord.load(directory) if stored is None else None
        except BuildRefused as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        held = stored if stored is not None else (record["dataset"] if record is not None else None)
        if held is not None and {k: held.get(k) for k in dataset} != dataset:
            print(f"error: {args.data_dir} holds {'another' if stored else 'the partial build of another'} dataset "
                  f"({describe(held)}); this run asks for {describe(dataset)}. Use another --data-dir, the same "
                  "figures, or delete the directory.", file=sys.stderr)
            return 2
        reused = stored
        try:  # what the record alone refuses, before any server starts (the database is checked again)
            if record is not None:
                refuse_several_writers_continuing(record, args.event_writers, 0)
        except BuildRefused as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        stop_leftover_postgres(directory)
    database = (migrated_sqlite_database() if args.sqlite else
                migrated_database("bench_storage", pg_directory=args.data_dir or "", keep=bool(args.data_dir),
                                  reuse=reused is not None or record is not None, pg_settings=pg_settings,
                                  env={"STREAM_WRITERS": stream_writers(args.event_writers)}
                                  if args.event_writers > 1 else None))
    stop_requested = StopOnSigterm()
    with database as db:
        stored_events = 0
        if reused is not None:
            print(f"reusing the dataset in {args.data_dir} ({describe(reused)}): persist skipped, reads only")
        elif record is not None:
            stored_events = count_dataset_events()
            print(f"continuing the build in {args.data_dir} ({describe(record['dataset'])}): the record says "
                  f"{record.stored_events():,} events stored (phase {record.phase}), the database holds "
                  f"{stored_events:,}")
        elif args.data_dir:  # a new dataset: a build interrupted before records existed is dropped
            marker_path(Path(args.data_dir)).unlink(missing_ok=True)
            record = BuildRecord(Path(db.pg.directory), dataset, slice_size=slice_size)
            record.save()
        if record is None:  # a throwaway database: the record in memory only
            record = BuildRecord(None, dataset, slice_size=slice_size)
        try:
            return run(events=events, rooms=rooms, users=users, batch=args.batch, samples=samples, seed=args.seed,
                       reused=reused, freeze_every=args.freeze_every, bulk_gc=args.bulk_gc, gc_young=args.gc_young,
                       room_cache=args.room_cache, event_writers=args.event_writers,
                       cache_scale=args.cache_scale, pg_settings=pg_settings, record=record, stored_events=stored_events,
                       stop_after=args.stop_after, read_partial=args.read_partial, stopping=stop_requested,
                       keep=(lambda since: write_marker(Path(db.pg.directory), dataset, since))
                       if args.data_dir else None)
        except BuildRefused as e:
            print(f"error: {e}", file=sys.stderr)
            return 2


def refuse_several_writers_continuing(record: BuildRecord, event_writers: int, stored_events: int) -> None:
    """A persist phase begun, or to be continued, by several event writers is not continued:
    each writer's place in the dataset is not recorded."""
    earlier_writers = {s.get("event_writers", 1) for s in record["sessions"] if s.get("phase") == "persist"}
    if record.phase == "persist" and (record["written"] or stored_events) and (
            event_writers > 1 or earlier_writers - {1}):
        raise BuildRefused("a persist phase shared by several event writers is not continued (each writer's "
                           "place in the dataset is not recorded): delete the directory to build again")


class StopOnSigterm:
    """SIGTERM during the build stops it after the batch in flight, recorded (a later run
    continues it); at any other moment it exits at once. Either way the kept PostgreSQL is
    shut down cleanly (the ``with`` around the run)."""

    def __init__(self) -> None:
        import signal

        self.asked = False
        self.building = False
        signal.signal(signal.SIGTERM, self._handler)

    def _handler(self, signum, frame) -> None:
        if not self.building:
            raise SystemExit(128 + signum)
        print("SIGTERM: stopping after the batch in flight", file=sys.stderr, flush=True)
        self.asked = True

    def __call__(self) -> bool:
        """Asked to stop?"""
        return self.asked


def stop_leftover_postgres(directory: Path) -> None:
    """A run killed outright (SIGKILL) leaves its PostgreSQL serving the kept cluster, which
    a new server on it would refuse: stop that one first (fast shutdown: its last
    transaction, never committed, rolls back)."""
    import signal

    pid_file = directory / "data" / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ValueError, IndexError, ProcessLookupError):
        return
    if b"postgres" not in cmdline or str(directory.resolve() / "data").encode() not in cmdline:
        return  # a stale file: the pid is another process now
    print(f"a PostgreSQL from an earlier run still serves {directory} (pid {pid}): shutting it down", flush=True)
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def count_dataset_events() -> int:
    """The dataset's events the database holds (the baseline's bare rows apart)."""
    from django.db import connection

    with connection.cursor() as c:
        c.execute("SELECT count(*) FROM events WHERE room_id NOT LIKE '!baseline%%'")
        return c.fetchone()[0]


def marker_path(directory: Path) -> Path:
    return directory / "dataset.json"


def read_marker(directory: Path) -> dict | None:
    """What a kept cluster holds (None: no finished dataset there)."""
    import json

    try:
        return json.loads(marker_path(directory).read_text())
    except FileNotFoundError:
        return None


def write_marker(directory: Path, dataset: dict, since: int) -> None:
    import json

    marker_path(directory).write_text(json.dumps({**dataset, "since": since}) + "\n")


def describe(d: dict) -> str:
    return (f"{d.get('events', 0):,} events, {d.get('rooms', 0):,} rooms, {d.get('users', 0):,} users, "
            f"seed {d.get('seed')}, batch {d.get('batch')}")


def run(*, events: int, rooms: int, users: int, batch: int, samples: int, seed: int, reused: dict | None = None,
        freeze_every: int | None = None, bulk_gc: str | None = None, gc_young: int | None = None,
        room_cache: int | None = None, cache_scale: float = 1.0, pg_settings: dict[str, str] | None = None,
        event_writers: int = 1, record: BuildRecord, stored_events: int = 0, stop_after: int | None = None,
        read_partial: bool = False, stopping=lambda: False, keep=None) -> int:
    from django.db import connection

    from rooms.storage import reads
    from rooms.storage.caches import storage_caches
    from rooms.storage.sql import store_cursor
    from rooms.storage.tokens import RoomStreamToken
    from streams.runtime import runtime

    print(f"machine: {cpu_description()}; load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f}")
    sqlite = connection.vendor == "sqlite"
    print(f"database: {connection.vendor}" + (f"; settings {pg_settings_text()}" if not sqlite else ""))
    print(f"dataset: {events:,} events, {rooms:,} rooms, {users:,} users, {batch} events per persist_events call")
    rt = runtime()

    if reused is None:
        if isinstance(stopping, StopOnSigterm):
            stopping.building = True
        try:
            built = build(rt, events=events, rooms=rooms, users=users, batch=batch, seed=seed,
                          freeze_every=freeze_every, bulk_gc=bulk_gc, gc_young=gc_young, room_cache=room_cache,
                          cache_scale=cache_scale, event_writers=event_writers,
                          pg_settings=pg_settings or {}, record=record,
                          stored_events=stored_events, stop_after=stop_after, stopping=stopping)
        finally:
            if isinstance(stopping, StopOnSigterm):
                stopping.building = False
            from rooms.storage.persist import persister_for

            persister_for(rt).end_bulk()  # the reads run with the collector as a serving process has it
        if built is None:
            if not read_partial:
                print("the reads run once the build is complete (or now, on the partial dataset, with "
                      "--read-partial)")
                rt.close()
                return 0
            with store_cursor() as cur:
                top = reads.current_token(cur)
            since = max(0, top - max(1, count_dataset_events() // 100))
            print(f"PARTIAL DATASET: {count_dataset_events():,} events of the ~{events:,} asked; the reads below "
                  f"measure it, not the dataset (incremental sync since stream position {since:,}, 1% back)")
        else:
            since = built
            if keep is not None:
                keep(since)
    else:
        since = int(reused["since"])

    # the reads run in a process set up as a serving one is (synapse_repl/asgi.py): what it
    # loaded before them lives as long as it does, frozen out of the collector's way
    from synapse_repl.gc_freeze import freeze_long_lived

    print(f"froze {freeze_long_lived():,} long-lived objects before the reads (as a serving process does)")

    # -- what the reads are asked: sampled first, so no sampling scan (whole tables, on PostgreSQL
    # a 7.7 GB one at 10 M events) pushes what a timed read needs out of the caches -------------
    with connection.cursor() as c:
        if not sqlite:
            c.execute("SELECT setseed(0.5)")
        sample_events = [r[0] for r in sampled(c, "event_to_state_groups", "event_id", "", samples)]
        c.execute("SELECT state_key, count(*) FROM current_state_events WHERE type = 'm.room.member' "
                  "AND membership = 'join' GROUP BY state_key ORDER BY count(*) DESC LIMIT %s", [samples])
        top = c.fetchall()
        # random events, each with a random member of its room who is joined now
        member = ("SELECT state_key FROM current_state_events c WHERE c.room_id = e.room_id "
                  "AND c.type = 'm.room.member' AND c.membership = 'join' ORDER BY random() LIMIT 1")
        events_sample = sampled(c, "events", "*", "NOT outlier AND room_id NOT LIKE '!baseline%%'", samples,
                                query=False)
        if sqlite:  # no LATERAL: a correlated subquery (rooms with no member left give NULL)
            c.execute(f"SELECT e.room_id, e.topological_ordering, e.stream_ordering, ({member}) "
                      f"FROM ({events_sample}) e", [samples])
            points = [p for p in c.fetchall() if p[3] is not None]
        else:
            c.execute(f"SELECT e.room_id, e.topological_ordering, e.stream_ordering, m.state_key "
                      f"FROM ({events_sample}) e CROSS JOIN LATERAL ({member}) m", [samples])
            points = c.fetchall()

    # -- state at event -----------------------------------------------------------------------
    caches = storage_caches()

    # each read with this process's caches empty; dropping the last read's (a big room's state
    # is ~67,000 keys: ~5 ms to free) is not part of it
    cold_ms = timed(lambda i: reads.state_at_event(sample_events[i]), len(sample_events),
                    before=lambda i: caches.forget())
    print(f"state at event, cold: {fmt(cold_ms)} (goal p99 <= 50 ms)")
    for e in sample_events:
        reads.state_at_event(e)
    warm_ms = timed(lambda i: reads.state_at_event(sample_events[i]), len(sample_events))
    print(f"state at event, warm: {fmt(warm_ms)}")

    # -- initial sync ---------------------------------------------------------------------------
    # initial sync's hard case: users in at least 100 rooms (the generator's power users)
    top = [t for t in top if t[1] >= 100] or top
    sync_users = [u for u, _ in top]
    print(f"sync users: {len(sync_users)} users in {min(n for _, n in top)}-{top[0][1]} joined rooms "
          f"({statistics.fmean(n for _, n in top):.0f} on average)")
    initial_ms = timed(lambda i: reads.initial_sync(sync_users[i % len(sync_users)], limit=20, rooms=100), samples)
    print(f"initial sync (20 events x 100 rooms): {fmt(initial_ms)} (goal p99 <= 50 ms)")

    # -- incremental sync: more live traffic after a token ----------------------------------------
    token = RoomStreamToken(since)
    reads.incremental_sync(sync_users[0], token)  # the change caches catch up once
    inc_ms = timed(lambda i: reads.incremental_sync(sync_users[i % len(sync_users)], token, limit=10), samples)
    with store_cursor() as cur:
        after = reads.current_token(cur) - since
    print(f"incremental sync (since a token {after:,} stream positions back): {fmt(inc_ms)} (goal p99 <= 30 ms)")
    # a user back after an absence: a token a tenth of the stream back (each room's ranges
    # closed since then used to be walked over the whole window: 44 s for one sync at 10 M)
    far = RoomStreamToken(max(0, since - since // 10))
    far_ms = timed(lambda i: reads.incremental_sync(sync_users[i % len(sync_users)], far, limit=10), samples)
    print(f"incremental sync after an absence (since a token {after + since - far.stream:,} stream positions "
          f"back): {fmt(far_ms)}")

    # -- back-pagination ----------------------------------------------------------------------
    pages: list[int] = []

    def paginate(i: int) -> None:
        room_id, topo, stream, user = points[i]
        page = reads.room_messages(room_id, user, from_token=RoomStreamToken(stream, topo), limit=20)
        pages.append(len(page["chunk"]))

    back_ms = timed(paginate, len(points))
    print(f"back-pagination (20 events from a random point, t-token): {fmt(back_ms)}; "
          f"{statistics.fmean(pages):.1f} events per page on average (goal p99 <= 10 ms)")

    # -- what is stored (after the timed reads: these scan whole tables) ------------------------
    state_storage(sqlite)
    database_size(sqlite)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    rt.close()
    return 0


def sampled(c, table: str, columns: str, where: str, n: int, *, query: bool = True):
    """``n`` random rows of ``table`` (``columns``, rows passing ``where``): on PostgreSQL drawn
    from a block sample of about 20 times as many rows (``TABLESAMPLE SYSTEM``: it reads those
    blocks only, where ``ORDER BY random()`` read the whole table -- 7.7 GB of events at 10 M
    -- and left the OS's cache full of it before the timed reads); the whole table when the
    sample would be too small, and on SQLite. ``query=False``: the SQL (its one parameter
    ``n``), to use as a subquery."""
    from django.db import connection

    def select(source: str) -> str:
        return f"SELECT {columns} FROM {source} {'WHERE ' + where if where else ''} ORDER BY random() LIMIT %s"

    source = table
    if connection.vendor == "postgresql":
        c.execute("SELECT reltuples FROM pg_class WHERE relname = %s", [table])
        estimate = c.fetchone()[0] or 0
        percent = 100 * 20 * n / estimate if estimate > 0 else 100
        if percent < 50:
            source = f"{table} TABLESAMPLE SYSTEM ({percent:.4f}) REPEATABLE (1)"
    if not query:
        return select(source)
    c.execute(select(source), [n])
    rows = c.fetchall()
    if len(rows) < n and source != table:  # an unlucky block sample: the whole table
        c.execute(select(table), [n])
        rows = c.fetchall()
    return rows


def state_storage(sqlite: bool) -> None:
    """State groups as stored (rows, groups, edges, packed copies) against full snapshots of
    every group (the mean state of 2,000 sampled groups times the groups)."""
    from django.db import connection

    from rooms.storage.sql import store_cursor
    from rooms.storage.state_groups import StateGroupStore

    with connection.cursor() as c:
        c.execute("SELECT count(*), count(*) FILTER (WHERE chain_length = 1) FROM state_groups")
        n_groups, n_snapshots = c.fetchone()
        c.execute("SELECT count(*) FROM state_groups_state")
        n_rows = c.fetchone()[0]
        if sqlite:  # table and index pages, as pg_total_relation_size counts them
            size = ("(SELECT sum(pgsize) FROM dbstat WHERE name IN (SELECT name FROM sqlite_master "
                    "WHERE tbl_name = '{}'))")
            c.execute("SELECT " + ", ".join(f"coalesce({size.format(t)}, 0)" for t in
                                            ("state_groups_state", "state_groups", "state_group_edges",
                                             "state_groups_packed")))
        else:
            c.execute("SELECT pg_total_relation_size('state_groups_state'), pg_total_relation_size('state_groups'), "
                      "pg_total_relation_size('state_group_edges'), pg_total_relation_size('state_groups_packed')")
        rows_bytes, groups_bytes, edges_bytes, packed_bytes = c.fetchone()
        c.execute("SELECT id FROM state_groups ORDER BY random() LIMIT 2000")
        sample_groups = [r[0] for r in c.fetchall()]
    store = StateGroupStore(cache_keys=10)
    with store_cursor() as cur:
        sizes = [len(store.get_state(cur, g)) for g in sample_groups]
    mean_size = statistics.fmean(sizes) if sizes else 0
    full_rows = n_groups * mean_size
    bytes_per_row = rows_bytes / n_rows if n_rows else 0
    ours = rows_bytes + groups_bytes + edges_bytes + packed_bytes  # the big groups' packed copies too
    full_bytes = full_rows * bytes_per_row + groups_bytes
    print(f"state storage: {n_groups:,} groups ({n_snapshots:,} snapshots), {n_rows:,} rows, {ours / 1e6:,.1f} MB "
          f"(packed copies {packed_bytes / 1e6:,.1f} MB); "
          f"as full snapshots ~{full_rows:,.0f} rows, ~{full_bytes / 1e6:,.1f} MB (mean state {mean_size:,.0f} keys, "
          f"{len(sample_groups)} sampled groups) -> ratio {ours / full_bytes if full_bytes else 0:.3f} "
          "(goal <= 0.05)")


def database_size(sqlite: bool) -> None:
    """The database's size on disk (tables, indexes, TOAST), per million stored events, and
    its largest tables."""
    from django.db import connection

    with connection.cursor() as c:
        c.execute("SELECT count(*) FROM events WHERE room_id NOT LIKE '!baseline%%'")
        n_events = c.fetchone()[0]
        if sqlite:
            c.execute("SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()")
            total = c.fetchone()[0]
            largest: list[tuple[str, int]] = []
        else:
            c.execute("SELECT pg_database_size(current_database())")
            total = c.fetchone()[0]
            c.execute("SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relkind = 'r' "
                      "AND relnamespace = 'public'::regnamespace ORDER BY 2 DESC LIMIT 6")
            largest = c.fetchall()
    per_million = total / n_events * 1e6 if n_events else 0
    tables = ("; largest: " + ", ".join(f"{name} {size / 1e6:,.0f} MB" for name, size in largest)) if largest else ""
    print(f"database size: {total / 1e6:,.0f} MB for {n_events:,} events -> {per_million / 1e6:,.0f} MB per million "
          f"events{tables}")


def rss_mb() -> float:
    """This process's resident memory, MB (the persister's caches grow with the rooms)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def database_mb() -> float:
    """The database's size on disk, MB (0 on SQLite)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return 0.0
    with connection.cursor() as c:
        c.execute("SELECT pg_database_size(current_database())")
        return c.fetchone()[0] / 1e6


def pg_settings_text() -> str:
    """The server's settings that decide its write path, as it reports them."""
    from django.db import connection

    names = ("shared_buffers", "max_wal_size", "checkpoint_timeout", "fsync", "full_page_writes",
             "synchronous_commit")
    with connection.cursor() as c:
        c.execute("SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)", [list(names)])
        found = {name: (setting, unit) for name, setting, unit in c.fetchall()}

    def shown(name: str) -> str:
        setting, unit = found.get(name, ("?", None))
        if unit == "8kB":
            return f"{int(setting) * 8 // 1024} MB"
        if unit == "MB":
            return f"{int(setting):,} MB"
        return setting + (unit or "")
    return ", ".join(f"{name} {shown(name)}" for name in names)


#: the server's write-path counters (:func:`pg_write_counters`), as differences per slice
PG_COUNTERS = ("wal_bytes", "wal_fpi", "checkpoints", "buffers_backend", "blks_read", "blks_hit")


def pg_write_counters() -> dict[str, int]:
    """The server's WAL bytes and full-page images, checkpoints, buffers the backends had to
    write out themselves (shared buffers full of dirty pages), and the database's blocks read
    from outside shared buffers against those found there: what a slice's database CPU went
    into (empty on SQLite)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    with connection.cursor() as c:
        c.execute("SELECT w.wal_bytes, w.wal_fpi, b.checkpoints_timed + b.checkpoints_req, b.buffers_backend, "
                  "d.blks_read, d.blks_hit FROM pg_stat_wal w, pg_stat_bgwriter b, pg_stat_database d "
                  "WHERE d.datname = current_database()")
        return dict(zip(PG_COUNTERS, map(int, c.fetchone())))


def pg_counters_text(before: dict[str, int], after: dict[str, int], events: int, cpu_here: float,
                     cpu_database: float) -> str:
    """One slice's CPU per event and write-path counters, per event where that reads best."""
    text = f"CPU per event {1e3 * cpu_here / events:.3f} ms here + {1e3 * cpu_database / events:.3f} ms database"
    if not before or not after:
        return text
    d = {k: after[k] - before[k] for k in PG_COUNTERS}
    reads = d["blks_read"] + d["blks_hit"]
    return (f"{text}; WAL {d['wal_bytes'] / events / 1024:.1f} KiB/event ({d['wal_fpi'] / events:.2f} full pages), "
            f"{d['checkpoints']} checkpoints, {d['buffers_backend'] / events:.2f} buffers written by the backend "
            f"and {d['blks_read'] / events:.2f} read from outside shared buffers per event "
            f"({100 * d['blks_read'] / reads if reads else 0:.1f}% of blocks)")


def build(rt, *, events: int, rooms: int, users: int, batch: int, seed: int, freeze_every: int | None = None,
          bulk_gc: str | None = None, gc_young: int | None = None, room_cache: int | None = None, cache_scale: float = 1.0,
          pg_settings: dict[str, str] | None = None, record: BuildRecord, event_writers: int = 1,
          stored_events: int = 0, stop_after: int | None = None, stopping=lambda: False) -> int | None:
    """Persist the dataset (timed), the bare-rows baseline, then 1% more live traffic after a
    token; returns that token (incremental sync's ``since``), or None when the build stopped
    before its end (``stop_after`` events of the dataset persisted, or ``stopping()``).

    ``record`` says how far an earlier run got (its phase, batches, rates so far); the
    database holds ``stored_events`` of the dataset's events. The generator is deterministic:
    what is stored is regenerated and skipped, and the build continues after it."""
    import gc

    from django.db import connection

    from rooms.models import Event
    from rooms.storage import persist_events, reads
    from rooms.storage.generator import RoomGenerator
    from rooms.storage.persist import persister_for
    from rooms.storage.sql import store_cursor

    # as generate_rooms: the persister's objects out of the collector's way every N batches
    persister = persister_for(rt)
    options = dict(freeze_every=freeze_every, bulk_gc=bulk_gc, gc_young=gc_young, cache_scale=cache_scale,
                   room_cache=room_cache)
    configure_persister(persister, **options)
    collector = ("the collector as Python runs it" if not persister.freeze_every else
                 "the collector off, nothing collected" if persister.bulk_gc == "freeze" else
                 f"a full collection first, collector thresholds {persister.gc_threshold}")
    print(f"gc.freeze every {persister.freeze_every or 'never'} batches ({collector}); "
          f"{persister.rooms.size:,} room contexts kept between batches; caches x{cache_scale:g}"
          + (f"; in each of {event_writers} event writer processes" if event_writers > 1 else ""))
    session = record.begin_session(cache_scale=cache_scale, room_cache=persister.rooms.size,
                                   freeze_every=persister.freeze_every, bulk_gc=persister.bulk_gc,
                                   pg_settings=pg_settings or {}, event_writers=event_writers)
    if session > 1:  # (the record is saved once what is stored is found to match it)
        print(f"continuing the build (session {session}): {record['written']:,} of the dataset's events persisted "
              f"in {record['batches']:,} batches, phase {record.phase}")
    refuse_several_writers_continuing(record, event_writers, stored_events)
    if record.phase in ("baseline", "analyze", "done") and stored_events != record.stored_events():
        raise BuildRefused(f"the database holds {stored_events:,} events of the dataset, the build record "
                           f"{record.stored_events():,} (phase {record.phase}): delete the directory to build again")
    #: the collector's seconds, the start of the collection running, then this session's
    #: collections per generation (seconds, how many) and what they found unreachable
    gc_s: list = [0.0, 0.0, [0.0, 0.0, 0.0], [0, 0, 0], 0]

    def gc_timer(phase: str, info: dict) -> None:  # the time the collector takes, to print it
        if phase == "start":
            gc_s[1] = time.perf_counter()
        else:
            took = time.perf_counter() - gc_s[1]
            gc_s[0] += took
            generation = info.get("generation", 2)
            gc_s[2][generation] += took
            gc_s[3][generation] += 1
            gc_s[4] += info.get("collected", 0)

    # -- persist ------------------------------------------------------------------------------
    if record.phase == "persist":
        gen = RoomGenerator(rooms=rooms, users=users, events=events, seed=seed, batch=batch)
        batches = gen.batches()
        if record["written"] or stored_events:
            t = time.perf_counter()
            extra_batches, extra = skip_stored(batches, recorded_batches=record["batches"],
                                               recorded_events=record["written"], stored_events=stored_events,
                                               what="dataset")
            skip_s = time.perf_counter() - t
            record["sessions"][-1]["skip_s"] = round(skip_s, 1)
            print(f"regenerated and skipped the {stored_events:,} stored events in {skip_s:.0f} s", flush=True)
            if extra:
                print(f"  ({extra:,} of them in {extra_batches} batches committed after the last record: "
                      "counted, not timed)")
                record.untimed(extra_batches, extra)
                record.save()
        gc.callbacks.append(gc_timer)
        try:
            if event_writers == 1:
                stopped = persist_phase(one_writer(rt, batches, gc_s), record, session=session, gc_s=gc_s,
                                        stop_after=stop_after, stopping=stopping)
            else:
                pool = EventWriterPool(event_writers, options)
                try:
                    stopped = persist_phase(writer_pool(pool, batches, batch), record, session=session, gc_s=gc_s,
                                            stop_after=stop_after, stopping=stopping)
                finally:
                    pool.close()
                print_writers(pool)
                if stopped:
                    print("(a build by several event writers is not continued: the next run refuses it)")
        finally:
            gc.callbacks.remove(gc_timer)
        print_persist_table(record, session)
        if event_writers == 1:  # (the writer processes' persisters are their own)
            replans = getattr(persister, "replans", None)
            if replans is not None:  # batches planned again after reading what a plan missed
                kinds = ", ".join(f"{n:,} for {kind}" for kind, n in sorted(persister.replan_kinds.items()))
                print(f"replans (a batch planned again after reading what its plan missed): {replans:,} in this "
                      "process" + (f" ({kinds})" if kinds else ""))
        if stopped:
            return None
        record.phase = "baseline"
        record.save()
    persist_rate = record["written"] / record["in_persist"] if record["in_persist"] else 0.0

    # -- the baseline: bare rows, the same batch size ---------------------------------------------
    if record.phase == "baseline":
        baseline_n = min(record["written"], 50_000)
        with connection.cursor() as c:
            c.execute("SELECT count(*) FROM events WHERE room_id LIKE '!baseline%%'")
            done = c.fetchone()[0]
        writer = rt.writer("events")
        brng = random.Random(seed)
        facts = [[(Event, Event.synthetic(brng, i) | {"room_id": f"!baseline{i % 50}:bench"})]
                 for i in range(baseline_n)]
        t = time.perf_counter()
        for i in range(done, baseline_n, batch):
            writer.append(facts[i:i + batch])
        base_s = time.perf_counter() - t
        rate = (baseline_n - done) / base_s if base_s else 0.0
        record["baseline"] = {"rows": baseline_n - done, "rate": rate, "session": session}
        record.phase = "live"
        record.save()
    if record["baseline"]:
        b = record["baseline"]
        print(f"baseline: {b['rows']:,} bare events rows with StreamWriter.append -> {b['rate']:,.0f} rows/s "
              f"(session {b['session']}); persist_events runs at "
              f"{persist_rate / b['rate'] if b['rate'] else 0:.2f} of it")

    # -- more live traffic after a token, for incremental sync ---------------------------------
    if record.phase == "live":
        more = RoomGenerator(rooms=max(10, rooms // 10), users=users, events=live_events(events), seed=seed + 1,
                             batch=batch)
        live = more.batches()
        if record["live_written"] or stored_events > record["written"]:
            if record["since"] is None:  # the token is recorded before the first live batch
                raise BuildRefused(f"the database holds {stored_events - record['written']:,} live events but the "
                                   "build record has no token before them: delete the directory to build again")
            extra_batches, extra = skip_stored(live, recorded_batches=record["live_batches"],
                                               recorded_events=record["live_written"],
                                               stored_events=stored_events - record["written"],
                                               what="live traffic")
            record["live_batches"] += extra_batches
            record["live_written"] += extra
        if record["since"] is None:
            with store_cursor() as cur:
                record["since"] = reads.current_token(cur)
        record.save()
        for b in live:
            persist_events(b.items, backfill=b.backfill, runtime=rt)
            record["live_batches"] += 1
            record["live_written"] += len(b.items)
            record.save()
            if stopping():
                print(f"stopped in the live traffic ({record['live_written']:,} events of it persisted)")
                return None
        print(f"then {record['live_written']:,} more live events after stream position {record['since']:,} "
              "(incremental sync's token)")
        record.phase = "analyze"
        record.save()
    if record.phase == "analyze":
        with connection.cursor() as c:
            c.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")
        record.phase = "done"
        record.end_session()
        record.save()
    return int(record["since"])


def live_events(events: int) -> int:
    """The live traffic after incremental sync's token: 1% of the dataset, at least 2,000
    events, and never more than the dataset itself (a small test build stays small)."""
    return max(min(2000, events), events // 100)


def one_writer(rt, batches, gc_s: list):
    """The persist phase's commits by this process: each batch through ``persist_events``,
    as ``(events, seconds, cpu here, cpu in the database, collector seconds)``."""
    from rooms.storage import persist_events

    def commits(go_on, state: dict):
        for b in batches:
            if not go_on():
                state["stopped"] = True
                return
            gc0 = gc_s[0]
            t, cpu0, db0 = time.perf_counter(), time.process_time(), backend_cpu_seconds()
            persist_events(b.items, backfill=b.backfill, runtime=rt)
            elapsed = time.perf_counter() - t
            yield len(b.items), elapsed, time.process_time() - cpu0, backend_cpu_seconds() - db0, gc_s[0] - gc0

    return commits


def writer_pool(pool: EventWriterPool, batches, size: int):
    """The persist phase's commits by the writer processes of ``pool``, each room's events
    routed to its writer (``_event_writers.route``); a commit's seconds are the wall time
    since the one before (the writers work at once), its CPU the writer's and its backend's."""
    def commits(go_on, state: dict):
        last = time.perf_counter()
        taken = 0

        def new_commits():
            nonlocal last, taken
            while taken < len(pool.committed):
                c = pool.committed[taken]
                taken += 1
                now = time.perf_counter()
                yield c.events, now - last, c.cpu_here, c.cpu_database, 0.0
                last = now

        for writer, b in route(batches, len(pool.names), size):
            if not go_on():
                state["stopped"] = True
                break
            pool.submit(writer, b)
            yield from new_commits()
        pool.drain()
        yield from new_commits()

    return commits


def print_writers(pool: EventWriterPool) -> None:
    for i, name in enumerate(pool.names):
        mine = [c for c in pool.committed if c.writer == i]
        n = sum(c.events for c in mine)
        if not n:
            continue
        busy = sum(c.seconds for c in mine)
        print(f"  event writer {name}: {n:,} events in {len(mine):,} batches, {busy:.0f} s inside persist_events "
              f"({n / busy:,.0f} events/s of its own), CPU per event {1e3 * sum(c.cpu_here for c in mine) / n:.3f} "
              f"ms there + {1e3 * sum(c.cpu_database for c in mine) / n:.3f} ms database; RSS at the end "
              f"{pool.rss_mb[i]:,.0f} MB")


def persist_phase(commits, record: BuildRecord, *, session: int, gc_s: list[float], stop_after: int | None,
                  stopping) -> bool:
    """The timed persist of the rest of the dataset, ``commits`` (:func:`one_writer`,
    :func:`writer_pool`) committing it, recorded after every committed batch; True if it
    stopped before the dataset's end."""
    started = time.monotonic()
    session_n, session_s = 0, 0.0
    slice_cpu = [0.0, 0.0]  # this slice's CPU so far, in the writers and in their database backends
    slice_counters = pg_write_counters()
    state = {"stopped": False}

    def go_on() -> bool:
        return not (stop_after is not None and record["written"] >= stop_after or stopping())

    for n, elapsed, cpu_here, cpu_database, gc_took in commits(go_on, state):
        load = os.getloadavg()[0]
        slice_cpu[0] += cpu_here
        slice_cpu[1] += cpu_database
        million, slice_ = record.persisted(
            n, seconds=elapsed, cpu_here=cpu_here, cpu_database=cpu_database, gc_s=gc_took,
            wall_s=time.monotonic() - started, load=load, session=session)
        started = time.monotonic()
        session_n += n
        session_s += elapsed
        if million is not None:
            record.close_million(million, rss_mb=round(rss_mb()), database_mb=round(database_mb()))
            print(f"  == million {len(record['per_million'])}: {million['rate']:,.0f} events/s; process RSS "
                  f"{rss_mb():,.0f} MB; database {database_mb():,.0f} MB; load average {million['load_mean']:.1f} "
                  f"(max {million['load_max']:.1f})", flush=True)
        record.save()
        if slice_ is not None:
            print(f"  ... {record['written']:,} events: this slice {slice_['rate']:,.0f} events/s, "
                  f"{session_n / session_s:,.0f} events/s this session ({record['wall_s']:.0f} s in all; "
                  f"gc {record['gc_s']:.1f} s so far; this session's collections by generation "
                  f"{' / '.join(f'{t:.1f} s in {n}' for t, n in zip(gc_s[2], gc_s[3]))}, finding "
                  f"{gc_s[4]:,} unreachable objects; RSS {rss_mb():,.0f} MB; load average {load:.1f})", flush=True)
            counters = pg_write_counters()
            print(f"      {pg_counters_text(slice_counters, counters, slice_['timed_events'], *slice_cpu)}",
                  flush=True)
            slice_counters, slice_cpu = counters, [0.0, 0.0]
    if not state["stopped"]:
        return False
    total = record["dataset"]["events"]
    print(f"stopped after {record['written']:,} events of the dataset's ~{total:,} (the build record is in "
          f"{record.directory}): run the same command again to continue", flush=True)
    record.end_session(stopped=True)
    record.save()
    return True


def print_persist_table(record: BuildRecord, session: int) -> None:
    """The rate per million events over the whole build (earlier sessions' millions from the
    record, marked so), then the totals."""
    per_million = record["per_million"]
    written = record["written"]

    def sessions(m: dict) -> str:
        earlier = [s for s in m["sessions"] if s != session]
        if not earlier:
            return "this session"
        return ("earlier session " if len(m["sessions"]) == 1 else "sessions ") + ", ".join(map(str, m["sessions"]))

    if per_million or record.open_million():
        n_sessions = len(record["sessions"])
        print(f"persist per million events (whole build, {n_sessions} session{'s' * (n_sessions > 1)}):")
        for i, m in enumerate(per_million, 1):
            print(f"  million {i}: {m['rate']:7,.0f} events/s  load average {m['load_mean']:4.1f} (max "
                  f"{m['load_max']:4.1f})  RSS {m.get('rss_mb', 0):,} MB  database {m.get('database_mb', 0):,} MB  "
                  f"[{sessions(m)}]")
        tail = record.open_million()
        if tail:
            print(f"  last {tail['timed_events']:,} events: {tail['rate']:7,.0f} events/s  load average "
                  f"{tail['load_mean']:4.1f} (max {tail['load_max']:4.1f})  [{sessions(tail)}]")
        if per_million:
            print(f"  lowest million {min(m['rate'] for m in per_million):,.0f} events/s (goal >= 2,000 sustained)")
    if written and record["in_persist"]:
        timed = written - record["untimed"]
        untimed = f" ({record['untimed']:,} untimed)" if record["untimed"] else ""
        writers = max((s.get("event_writers", 1) for s in record["sessions"]), default=1)
        timed_as = ("inside persist_events" if writers == 1 else
                    f"of wall time, {writers} event writers at once (generating and routing included)")
        print(f"persist: {written:,} events{untimed} in {record['in_persist']:.1f} s {timed_as} -> "
              f"{timed / record['in_persist']:,.0f} events/s (goal >= 2,000); the garbage collector ran "
              f"{record['gc_s']:.1f} s of the phase's {record['wall_s']:.0f} s (generating events included); CPU per "
              f"event {1e3 * record['cpu_here'] / timed:.3f} ms {'here' if writers == 1 else 'in the writers'} + "
              f"{1e3 * record['cpu_database'] / timed:.3f} ms database")
        slices = record["slices"]
        if slices:
            print("per slice of " + f"{record['slice_size']:,} events: " +
                  ", ".join(f"{s['rate']:,.0f}" for s in slices) + " events/s")


if __name__ == "__main__":
    sys.exit(main())
