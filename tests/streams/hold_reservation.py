"""A writer process that dies mid-transaction, for the SIGKILL test.

Run as ``python -m tests.streams.hold_reservation STREAM [FIRST]`` with DATABASE_URL,
INSTANCE_NAME and STREAM_WRITERS set: it writes FIRST facts (default 0) one per transaction
and waits until they are published to replication (if REDIS_URL is set), then reserves one
stream ID, inserts its row inside the still-open transaction, prints the ID and waits to be
killed.

``python -m tests.streams.hold_reservation STREAM append N``: ``StreamWriter.append`` of N facts
(the writer's own transaction, completed in its commit); the test blocks it in the server
with a table lock and kills it there.
"""
import os
import random
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")
django.setup()

from streams.registry import get_stream  # noqa: E402
from streams.runtime import runtime  # noqa: E402


def append(stream: str, n: int) -> None:
    spec = get_stream(stream)
    writer = runtime().writer(stream)
    model = spec.primary_model
    rng = random.Random()
    print("appending", flush=True)
    writer.append([[(model, model.synthetic(rng, i))] for i in range(n)])
    print("committed", flush=True)
    time.sleep(600)


def main(stream: str, first: int = 0) -> None:
    spec = get_stream(stream)
    rt = runtime()
    writer = rt.writer(stream)
    model = spec.primary_model
    rng = random.Random()
    for i in range(first):
        writer.append([[(model, model.synthetic(rng, i))]])
    if rt.streamer is not None:
        rt.streamer.flush()
    with writer.transaction(1) as ids:
        writer.insert_rows(ids, [[(model, model.synthetic(random.Random(), 0))]])
        print(ids[0], flush=True)
        time.sleep(600)


if __name__ == "__main__":
    if sys.argv[2:3] == ["append"]:
        append(sys.argv[1], int(sys.argv[3]))
    else:
        main(sys.argv[1], *map(int, sys.argv[2:3]))
