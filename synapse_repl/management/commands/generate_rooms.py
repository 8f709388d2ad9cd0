"""``manage.py generate_rooms --rooms R --users U --events E --seed S``

Creates a realistic dataset (rooms.storage.generator) through the real persist path, with
a progress bar, on PostgreSQL or SQLite (the embedded default).
"""
from __future__ import annotations

import sys
import time

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from rooms.models import Room
from rooms.storage import BadEvent, StorageUnsupported, persist_events
from rooms.storage.generator import RoomGenerator
from rooms.storage.persist import FREEZE_EVERY, persister_for
from streams.runtime import runtime
from synapse_repl.startup import check_startable

#: Without --seed: not the demo's seed 0, so a first generate_rooms next to the demo's rooms
#: does not collide with them.
DEFAULT_SEED = 1


class Command(BaseCommand):
    help = "Generate synthetic rooms (big churny rooms, many small ones, backfill) through persist_events."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rooms", type=int, required=True, help="rooms to create (a few big churny ones, the rest small)")
        parser.add_argument("--users", type=int, required=True, help="distinct users who join and write in them")
        parser.add_argument("--events", type=int, required=True, help="approximate number of events")
        parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                            help=f"room and event IDs derive from it: one run per seed (default {DEFAULT_SEED}; "
                                 "the demo's first-run rooms use seed 0)")
        parser.add_argument("--batch", type=int, default=500, help="events per persist_events call")
        parser.add_argument("--no-progress", action="store_true", help="print no progress bar (logs, scripts)")

    def handle(self, *args, rooms: int, users: int, events: int, seed: int, batch: int, no_progress: bool,
               **options) -> None:
        try:
            gen = RoomGenerator(rooms=rooms, users=users, events=events, seed=seed, batch=batch)
        except ValueError as e:
            raise CommandError(str(e)) from None
        if batch < 1:
            raise CommandError("--batch must be >= 1")
        check_startable(database=True, redis=True)
        rt = runtime()
        # this process only persists: its caches' objects out of the collector's way
        persister_for(rt).freeze_every = FREEZE_EVERY
        try:
            if Room.objects.filter(room_id=gen.room_ids()[0]).exists():
                raise CommandError(f"seed {seed} was already generated into this database; use another --seed")
            written = 0
            started = time.monotonic()
            bar = tqdm(total=events, unit="ev", desc="generate_rooms", disable=no_progress or None, file=sys.stderr)
            try:
                for b in gen.batches():
                    persist_events(b.items, backfill=b.backfill, runtime=rt)
                    written += len(b.items)
                    bar.total = max(bar.total, gen.emitted)
                    bar.update(len(b.items))
            finally:
                bar.close()
            elapsed = time.monotonic() - started
            self.stdout.write(f"persisted {written} events in {rooms} rooms for {users} users in {elapsed:.1f} s "
                              f"({written / elapsed if elapsed else 0:.0f} events/s)")
        except (StorageUnsupported, BadEvent) as e:
            raise CommandError(str(e)) from None
        finally:
            persister_for(rt).end_bulk()  # the collector as it was (an in-process call: tests)
            rt.close()
