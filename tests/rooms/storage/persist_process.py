"""An event writer process for the two-writer-processes test.

Run as ``python -m tests.rooms.storage.persist_process EVENTS.json`` with DATABASE_URL,
INSTANCE_NAME and STREAM_WRITERS set. The file lists ``[event_id, pdu_json, prev_event_ids]``
in the order to persist; each event is persisted in its own transaction (``persist_events``,
this process's runtime) as soon as its prev events are in the database, wherever they came
from: so this process extends the room from what the other writer persisted.
"""
import json
import os
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")
django.setup()

from django.db import connection  # noqa: E402

from rooms.storage import persist_events  # noqa: E402

WAIT_SECONDS = 180


def wait_for(prevs: list[str]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM events WHERE event_id = ANY(%s)", [prevs])
            if cursor.fetchone()[0] == len(set(prevs)):
                return
        if time.monotonic() > deadline:
            sys.exit(f"prev events {prevs} not persisted within {WAIT_SECONDS} s")
        time.sleep(0.01)


def main(path: str) -> None:
    with open(path) as f:
        plan = json.load(f)
    for event_id, pdu, prevs in plan:
        wait_for(prevs)
        (done,) = persist_events([pdu.encode()])
        assert done.event_id == event_id, (done.event_id, event_id)
    print(f"persisted {len(plan)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
