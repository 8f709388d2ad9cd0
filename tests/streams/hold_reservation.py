"""A writer process that dies mid-transaction, for the SIGKILL test.

Run as ``python -m tests.streams.hold_reservation STREAM`` with DATABASE_URL, INSTANCE_NAME
and STREAM_WRITERS set: it reserves one stream ID, inserts its row inside the still-open
transaction, prints the ID and waits to be killed.
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


def main(stream: str) -> None:
    spec = get_stream(stream)
    writer = runtime().writer(stream)
    model = spec.primary_model
    with writer.transaction(1) as ids:
        writer.insert_rows(ids, [[(model, model.synthetic(random.Random(), 0))]])
        print(ids[0], flush=True)
        time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1])
