"""``manage.py write_facts STREAM --count N [--rate R] [--per-txn B] [--stamps PATH] [--concurrency C]``

Writes synthetic facts through the real writer path (reserve IDs, insert, complete), to
smoke-test a deployment, drive the demo, the benchmarks and the tests. SIGTERM stops it after
the transaction in progress. ``--stamps PATH`` appends ``"<stream ID> <Unix time>"`` per fact
once its transaction is complete (for delivery latencies: benchmarks/soak.py).

``events`` go through the room event store (``persist_events``), as coherent, authorized rooms
(``rooms.storage.synthetic.LiveRooms``): each writer (and each of its threads) continues its
own rooms, ``!live-<instance>-<i>``, so the room store stays what the batch jobs recompute.
``backfill`` is refused: old history comes with its rooms (``generate_rooms``).

``--concurrency C`` keeps C transactions in flight, as an event persister with a connection
pool does (Synapse's DB pool): C threads share this process's ``StreamWriter`` and ID
generator, each on its own connection, so one's Python work overlaps another's wait for
PostgreSQL. IDs then complete out of order; the generator advances the writer's position only
over contiguous completed IDs, and the streamer publishes in position order (docs/streams.md).
"""
from __future__ import annotations

import random
import signal
import sys
import threading
import time

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from tqdm import tqdm

from replication.http.typing_changes import send_typing
from rooms.storage.synthetic import LiveRooms
from streams.conf import repl_setting
from streams.dialect import several_writers
from streams.id_generator import NotAWriter
from streams.registry import STREAMS
from streams.runtime import runtime
from synapse_repl.startup import check_startable


class Command(BaseCommand):
    help = "Write synthetic facts to a stream through the real writer path."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("stream", help=f"one of: {', '.join(n for n, s in STREAMS.items() if s.db_backed)}, "
                                           "typing")
        parser.add_argument("--count", type=int, required=True, help="how many facts to write")
        parser.add_argument("--rate", type=float, default=0.0, help="facts per second (default: as fast as possible)")
        parser.add_argument("--per-txn", type=int, default=1, help="facts per transaction (default 1)")
        parser.add_argument("--seed", type=int, default=None, help="random seed for the synthetic rows")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")
        parser.add_argument("--stamps", default=None, metavar="PATH",
                            help="append '<stream ID> <Unix time>' per fact written to PATH")
        parser.add_argument("--concurrency", type=int, default=1, metavar="N",
                            help="transactions in flight at once: N threads, each on its own database "
                                 "connection (PostgreSQL only; default 1; docs/streams.md)")
        parser.add_argument("--url", default=None, metavar="URL",
                            help="typing only: the web address of the typing writer, which keeps the "
                                 "stream in memory (default http://WEB_LISTEN)")

    def handle(self, *args, stream: str, count: int, rate: float, per_txn: int, seed: int | None,
               no_progress: bool, stamps: str | None = None, concurrency: int = 1, url: str | None = None,
               **options) -> None:
        spec = STREAMS.get(stream)
        if spec is None:
            raise CommandError(f"unknown stream {stream!r}; known: {', '.join(STREAMS)}")
        if stream == "typing":
            if count < 0 or per_txn < 1 or rate < 0:
                raise CommandError("--count must be >= 0, --per-txn >= 1 and --rate >= 0")
            return self._write_typing(count, rate, per_txn, seed, url)
        if not spec.db_backed:
            raise CommandError(f"stream {stream} is kept in memory; write_facts writes database-backed streams "
                               "and typing")
        if stream == "backfill":
            raise CommandError("write_facts does not write backfill: backfilled events belong to a room's "
                               "history (manage.py generate_rooms writes some)")
        if count < 0 or per_txn < 1 or rate < 0 or concurrency < 1:
            raise CommandError("--count must be >= 0, --per-txn >= 1, --rate >= 0 and --concurrency >= 1")
        # Before writing anything: the database, and Redis that every write is announced on.
        check_startable(database=True, redis=True)

        rt = runtime()
        try:
            writer = rt.writer(stream)
            if not writer.generator.is_writer:
                raise NotAWriter(
                    f"{rt.instance_name} is not a writer of {stream} (writers: "
                    f"{', '.join(writer.generator.writers or ())}); set INSTANCE_NAME or STREAM_WRITERS"
                )
        except NotAWriter as e:
            raise CommandError(str(e)) from None
        if concurrency > 1 and not several_writers(writer.using):
            raise CommandError("--concurrency above 1 needs PostgreSQL (SQLite has one writing transaction)")

        model = spec.primary_model
        rng = random.Random(seed)
        rooms: dict[int, LiveRooms] = {}  # events: each thread its own rooms (no fork between them)
        written = 0
        claimed = 0
        first_id = last_id = None
        started = time.monotonic()
        stopping: list[bool] = []
        failures: list[BaseException] = []
        state_lock = threading.Lock()
        in_main = threading.current_thread() is threading.main_thread()  # signals: main thread only
        previous_handler = signal.signal(signal.SIGTERM, lambda *_: stopping.append(True)) if in_main else None
        stamp_file = open(stamps, "a", encoding="ascii") if stamps else None
        bar = tqdm(total=count, unit="fact", desc=f"{stream} as {rt.instance_name}",
                   disable=no_progress or None, file=sys.stderr)

        def write_loop() -> None:
            nonlocal written, claimed, first_id, last_id
            while not stopping and not failures:
                with state_lock:
                    if claimed >= count:
                        return
                    start, batch = claimed, min(per_txn, count - claimed)
                    claimed += batch
                    if stream == "events":
                        live = rooms.get(threading.get_ident())
                        if live is None:
                            live = rooms[threading.get_ident()] = LiveRooms(
                                f"live-{rt.instance_name}-" + (f"t{len(rooms)}-" if concurrency > 1 else ""),
                                rng=random.Random(rng.getrandbits(64)))
                    else:
                        # Made under the lock, in order: the same rows for a seed at any concurrency.
                        facts = [[(model, model.synthetic(rng, start + i))] for i in range(batch)]
                if stream == "events":
                    ids = [p.stream_ordering for p in live.write(batch, runtime=rt)]
                else:
                    ids = writer.append(facts)
                with state_lock:
                    # abs: the first and last written, on backwards streams (negative IDs) too
                    if first_id is None or abs(ids[0]) < abs(first_id):
                        first_id = ids[0]
                    if last_id is None or abs(ids[-1]) > abs(last_id):
                        last_id = ids[-1]
                    if stamp_file:
                        now = time.time()
                        stamp_file.write("".join(f"{i} {now:.4f}\n" for i in ids))
                        stamp_file.flush()
                    written += batch
                    bar.update(batch)
                if rate:
                    # Keep to the average rate: sleep until the next fact is due.
                    delay = started + (start + batch) / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)

        def thread_body() -> None:
            try:
                write_loop()
            except BaseException as e:  # stop the others, re-raised below
                failures.append(e)
            finally:
                connections.close_all()  # this thread's own connections

        try:
            if concurrency == 1:
                write_loop()
            else:
                threads = [threading.Thread(target=thread_body, name=f"write_facts-{i}") for i in range(concurrency)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                if failures:
                    raise failures[0]
        finally:
            bar.close()
            if in_main:
                signal.signal(signal.SIGTERM, previous_handler)
            if stamp_file:
                stamp_file.close()
            elapsed = time.monotonic() - started
            gen = writer.generator
            self.stdout.write(
                f"wrote {written} facts to {stream} as {rt.instance_name} in {elapsed:.2f} s "
                f"({written / elapsed if elapsed else 0:.0f} facts/s); IDs {first_id}..{last_id}; "
                f"position {gen.get_current_token_for_writer(rt.instance_name)}, "
                f"linear {gen.get_current_token()} (linear: the highest ID up to which every writer "
                f"of {stream} has finished, what a reader may follow; it lags while another writer is "
                f"behind or gone)"
                + (f"; {concurrency} transactions in flight" if concurrency > 1 else "")
            )
            rt.close()

    def _write_typing(self, count: int, rate: float, per_txn: int, seed: int | None, url: str | None) -> None:
        """Typing changes, sent to the typing writer (it keeps them in memory: this process
        cannot be it). Each change toggles one (room, user): every change is a new row."""
        from django.conf import settings

        url = url or f"http://{repl_setting('WEB_LISTEN')}"
        server = repl_setting("SERVER_NAME")
        rng = random.Random(seed)
        typing: set[tuple[str, str]] = set()
        started = time.monotonic()
        sent, answer = 0, {}
        while sent < count:
            batch = []
            for _ in range(min(per_txn, count - sent)):
                room, user = f"!typing{rng.randrange(10)}:{server}", f"@user{rng.randrange(20)}:{server}"
                # (a room/user pair drawn twice in one request still toggles: tracked here)
                now_typing = (room, user) not in typing
                (typing.add if now_typing else typing.discard)((room, user))
                batch.append({"room_id": room, "user_id": user, "typing": now_typing, "timeout": 120_000})
            try:
                answer = send_typing(url, batch, secret=settings.REPLICATION_SECRET)
            except RuntimeError as e:
                raise CommandError(str(e)) from None
            except OSError as e:
                raise CommandError(f"could not reach the typing writer at {url}: {e} "
                                   "(it keeps the stream in memory: start it, or give its address with --url)") from None
            sent += len(batch)
            if rate:
                delay = started + sent / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        elapsed = time.monotonic() - started
        self.stdout.write(f"sent {sent} typing changes to {answer.get('writer', '?')} at {url} in {elapsed:.2f} s; "
                          f"position {answer.get('stream_id', '?')}")
