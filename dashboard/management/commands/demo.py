"""``manage.py demo``: a small demo dataset, then a slow trickle of facts, so a newcomer
opening the dashboard sees positions move (``make run`` starts it; ``DEMO=0`` turns it off).

Embedded default only: it refuses to run on PostgreSQL or with ``REDIS_URL`` (full mode is a
real cluster; no demo facts there, ever). Facts go through the real writer path, as
``write_facts`` does; the dataset is written only into empty fact tables. Events go through
the room event store (``persist_events``) as coherent, authorized rooms (``LiveRooms``: each
room starts with its create event, its creator's join, power levels and join rules; members
join before they speak), so the batch jobs' checks find nothing on a fresh install. It also
persists a small room history (``generate_rooms``' generator: about a second), once, so the
event admin and ``/api/`` have rooms to show. One demo at a time per ``STATE_DIR``: it holds
``STATE_DIR/demo.lock`` for its life (common/state_lock.py); a second one is refused in
one line naming the first one's pid.
"""
from __future__ import annotations

import random
import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from common.state_lock import StateLockHeld, hold
from rooms.models import Room
from rooms.storage import persist_events
from rooms.storage.generator import RoomGenerator
from rooms.storage.synthetic import LiveRooms
from streams.dialect import is_local_file
from streams.registry import STREAMS
from streams.runtime import runtime

#: The first-run dataset: facts per stream.
DATASET = {"events": 120, "receipts": 60, "account_data": 20, "to_device": 10, "caches": 10}
#: The first-run rooms (``generate_rooms --rooms 20 --users 50 --events 2000 --seed 0``).
ROOMS = {"rooms": 20, "users": 50, "events": 2000, "seed": 0}
#: The demo's live rooms (``!demo-<i>:localhost``), where its events go.
LIVE_ROOMS = {"rooms": 8, "users": 40}
#: How the trickle spreads over the streams.
TRICKLE_WEIGHTS = {"events": 5, "receipts": 3, "account_data": 1, "to_device": 1, "caches": 1}


def embedded_default() -> bool:
    return not settings.REDIS_URL and is_local_file("default")


#: Who holds the demo's lock, as a refusal names it.
DEMO_LOCK_WHAT = "a demo of this STATE_DIR"


def demo_lock_path():
    """The lock one demo per ``STATE_DIR`` holds."""
    return settings.STATE_DIR / "demo.lock"


class Command(BaseCommand):
    help = "Write a small demo dataset, then trickle demo facts (embedded default only)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--rate", type=float, default=2.0, help="trickle: facts per second on average (default 2)")
        parser.add_argument("--seed-only", action="store_true", help="write the dataset (if empty) and stop")
        parser.add_argument("--ticks", type=int, default=None, metavar="N",
                            help="stop after N trickle writes (default: run until stopped)")

    def handle(self, *args, rate: float, seed_only: bool, ticks: int | None = None, **options) -> None:
        if not embedded_default():
            raise CommandError("the demo runs only on the embedded default (SQLite, no REDIS_URL); "
                               "full mode never gets demo facts")
        if rate <= 0 or (ticks is not None and ticks < 0):
            raise CommandError("--rate must be > 0 and --ticks >= 0")
        try:
            lock = hold(demo_lock_path(), DEMO_LOCK_WHAT)
        except StateLockHeld as e:
            raise CommandError(str(e)) from None
        with lock:
            self._run(rate, seed_only, ticks)

    def _run(self, rate: float, seed_only: bool, ticks: int | None) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        rt = runtime()
        rng = random.Random()
        self.rooms, self.runtime = LiveRooms("demo-", **LIVE_ROOMS, rng=rng), rt
        try:
            writers = {name: rt.writer(name) for name in TRICKLE_WEIGHTS
                       if name in STREAMS and rt.writer(name).generator.is_writer}
            if not writers:
                raise CommandError(f"{rt.instance_name} writes none of the demo streams")
            rooms_empty = not Room.objects.exists()  # before the dataset's events make rooms
            if not any(STREAMS[name].primary_model.objects.exists() for name in writers):
                for name, count in DATASET.items():
                    if name in writers:
                        self._write(writers[name], rng, count, per_txn=10)
                self.stdout.write(f"demo: wrote a small dataset ({sum(DATASET.values())} facts)")
            if "events" in writers and rooms_empty:
                n = self._rooms(rt)
                self.stdout.write(f"demo: persisted {n} room events in {ROOMS['rooms']} rooms")
            if seed_only:
                return
            self.stdout.write(f"demo: trickling about {rate:g} facts/s (DEMO=0 turns this off)")
            self.stdout.flush()
            names, weights = zip(*((n, w) for n, w in TRICKLE_WEIGHTS.items() if n in writers))
            done = 0
            while not stop.is_set() and (ticks is None or done < ticks):
                self.tick(writers, rng, names, weights, rate, stop)
                done += 1
        finally:
            rt.close()

    def tick(self, writers, rng: random.Random, names, weights, rate: float, stop: threading.Event) -> None:
        """One trickle write: 1-3 facts to a stream drawn by weight, then a pause."""
        name = rng.choices(names, weights)[0]
        n = rng.randint(1, 3)
        self._write(writers[name], rng, n, per_txn=n)
        stop.wait(n / rate * rng.uniform(0.5, 1.5))

    @staticmethod
    def _rooms(rt) -> int:
        written = 0
        for batch in RoomGenerator(**ROOMS, batch=500).batches():
            persist_events(batch.items, backfill=batch.backfill, runtime=rt)
            written += len(batch.items)
        return written

    def _write(self, writer, rng: random.Random, count: int, per_txn: int) -> None:
        model = writer.spec.primary_model
        done = 0
        while done < count:
            batch = min(per_txn, count - done)
            if writer.spec.name == "events":  # through the room event store, as rooms
                self.rooms.write(batch, runtime=self.runtime)
            else:
                writer.append([[(model, model.synthetic(rng, rng.getrandbits(32)))] for _ in range(batch)])
            done += batch
