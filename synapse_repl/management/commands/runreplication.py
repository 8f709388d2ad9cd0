"""``manage.py runreplication``: the TCP replication endpoint on ``REPLICATION_LISTEN``."""
from __future__ import annotations

import asyncio
import errno
import signal
import sys

from django.core.management.base import BaseCommand

from replication.endpoint.loop_lag import watch_loop_lag
from replication.endpoint.server import start_endpoint
from streams.conf import repl_setting
from streams.runtime import runtime
from synapse_repl.errors import database_errors_as_one_line
from synapse_repl.gc_freeze import freeze_long_lived
from synapse_repl.management.commands.runservice import split_listen
from synapse_repl.startup import check_startable, listen_problem

#: Seconds a thread may hold the GIL while the event loop waits for it (Python's default: 0.005).
SWITCH_INTERVAL = 0.001


class Command(BaseCommand):
    help = "Serve Synapse's TCP replication protocol on REPLICATION_LISTEN."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--listen", default=None, help="host:port (default: REPLICATION_LISTEN)")

    def handle(self, *args, listen: str | None = None, **options) -> None:
        setting = "--listen" if listen else "REPLICATION_LISTEN"
        host, port = split_listen(listen or repl_setting("REPLICATION_LISTEN"), setting)
        check_startable(database=True, listen=((host, port, setting),))
        # The event loop must get the GIL back quickly from threads (history pages, database
        # polls): every wait for it delays every connection (5 ms by default, per hand-over).
        sys.setswitchinterval(SWITCH_INTERVAL)
        try:
            # the database gone or out of connections once serving: one line, exit 1
            with database_errors_as_one_line():
                asyncio.run(self._serve(host, port))
        except OSError as e:  # taken between the check and the bind
            if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
                raise
            raise listen_problem(e, host, port, setting) from None

    async def _serve(self, host: str, port: int) -> None:
        from asgiref.sync import sync_to_async

        endpoint, server = await start_endpoint(
            host, port, streams=await sync_to_async(runtime, thread_sensitive=False)())
        # Everything loaded so far (Django, the app, the relay's state) lives as long as the
        # process: out of the collector's way, so that a full collection walks only what
        # connections create (measured: 70-130 ms pauses of the whole loop, every ~10 s under
        # attack, before; docs/benchmarks.md).
        freeze_long_lived()
        lag = asyncio.create_task(watch_loop_lag(float(repl_setting("REPLICATION_LOOP_LAG_WARN_MS"))),
                                  name="loop-lag")
        self.stdout.write(f"replication endpoint of {endpoint.server_name} listening on {host}:{port}")
        self.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        lag.cancel()
        server.close()
        await endpoint.relay.stop()
        await endpoint.stop()  # the USER_IP sightings not yet written go to the table
