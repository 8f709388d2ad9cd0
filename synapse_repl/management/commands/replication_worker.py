"""``manage.py replication_worker``: follow the replication streams as a worker (docs/replication.md).

Two ways to follow the cluster:

* ``--connect HOST:PORT`` (default: ``REPLICATION_LISTEN``): over TCP, through a replication
  endpoint (``runreplication``), whose ``SERVER`` must be ``--server-name``.
* ``--redis [--redis-url URL]`` (default URL: ``settings.REDIS_URL``; ``--redis-url`` alone
  implies ``--redis``): straight from Redis pub/sub, as Synapse workers do
  (``synapse/replication/tcp/redis.py``; docs/replication.md, "Redis, as Synapse speaks it"): the
  worker SUBSCRIBEs to the channel named exactly the server name (``--server-name``, default
  ``SERVER_NAME``), and once subscribed PUBLISHes ``REPLICATE ``; writers answer with their
  positions and publish their RDATA/POSITION there. ``--connect`` cannot be combined with it.

Either way, gaps are fetched from the catch-up endpoint of the writer that wrote the facts:
``--instance-url WRITER=URL`` (repeatable; over the ``REPLICATION_INSTANCE_MAP`` setting, as
Synapse's ``instance_map``), else ``--catchup-url`` (default ``http://WEB_LISTEN``);
``caches`` rows are applied to the local Django cache and, with
``--jsonl``, every fact received is appended to a file as one JSON line
``{"stream", "writer", "token", "rows"}`` (with ``--jsonl-timestamps`` also ``"at"``, when the
worker delivered it, ``time.time()``: for latency measurements such as benchmarks/soak.py).
That file is also the worker's memory: on start the last token per (stream, writer) found in
it is where the worker resumes, so restarting with the same file neither repeats nor skips a
fact. Stops cleanly on SIGTERM/SIGINT.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from common.url_redaction import redact_text, redact_url
from dashboard.worker_status import publish_loop
from replication.endpoint.tls import client_context_from_settings
from replication.worker.catchup_client import parse_instance_map
from replication.worker.redis_worker import RedisReplicationWorker
from replication.worker.tcp_worker import ReplicationWorker
from replication.worker.worker_core import BaseReplicationWorker
from streams.conf import repl_setting
from streams.registry import STREAMS
from synapse_repl.management.commands.runservice import split_listen


class JsonlSink:
    """Appends facts to a JSON-lines file, flushed per line (readers may tail it).

    Called from each stream's own thread, hence the lock.
    """

    def __init__(self, path: str, timestamps: bool = False) -> None:
        self.path = path
        self.timestamps = timestamps
        self._lock = threading.Lock()
        self.positions: dict[tuple[str, str], int] = {}
        if os.path.exists(path):
            self._load()
        self._file = open(path, "a", encoding="utf-8")

    def _load(self) -> None:
        """Where we are: the last token per (stream, writer); a torn last line is ended."""
        with open(self.path, "rb") as f:
            data = f.read()
        for line in data.splitlines():
            try:
                fact = json.loads(line)
                self.positions[(fact["stream"], fact["writer"])] = int(fact["token"])
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a crash: its fact will be fetched again
        if data and not data.endswith(b"\n"):
            with open(self.path, "ab") as f:
                f.write(b"\n")

    def __call__(self, stream: str, writer: str, token: int, rows: list[Any]) -> None:
        fact = {"stream": stream, "writer": writer, "token": token, "rows": rows}
        if self.timestamps:
            fact["at"] = round(time.time(), 4)
        line = json.dumps(fact, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class Command(BaseCommand):
    help = ("Follow the replication streams (a worker process), through a replication endpoint "
            "(--connect) or Redis pub/sub (--redis).")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--name", required=True, help="this worker's instance name")
        parser.add_argument("--connect", default=None, metavar="HOST:PORT",
                            help="replication endpoint (default: REPLICATION_LISTEN); "
                                 "not with --redis")
        parser.add_argument("--redis", action="store_true",
                            help="follow Redis pub/sub directly instead of an endpoint")
        parser.add_argument("--redis-url", default=None, metavar="URL",
                            help="Redis to follow (default: REDIS_URL); implies --redis")
        parser.add_argument("--catchup-url", default=None, metavar="URL",
                            help="base URL of the catch-up endpoint for writers without "
                                 "--instance-url (default: http://WEB_LISTEN)")
        parser.add_argument("--instance-url", action="append", default=[], metavar="WRITER=URL",
                            help="catch-up base URL of one writer (repeatable; over "
                                 "REPLICATION_INSTANCE_MAP)")
        parser.add_argument("--server-name", default=None,
                            help="expected SERVER name, and with --redis the channel "
                                 "(default: SERVER_NAME)")
        parser.add_argument("--streams", default=None, metavar="A,B",
                            help="follow only these streams (default: all)")
        parser.add_argument("--jsonl", default=None, metavar="PATH",
                            help="append each fact to PATH as a JSON line; resume from it")
        parser.add_argument("--jsonl-timestamps", action="store_true",
                            help="add to each JSON line when it was delivered (\"at\": Unix time)")

    def handle(self, *args, **options) -> None:
        use_redis = options["redis"] or options["redis_url"] is not None
        if use_redis and options["connect"]:
            raise CommandError("--connect cannot be used with --redis: a Redis worker follows "
                               "the Redis channel, not a replication endpoint")
        catchup_url = options["catchup_url"] or f"http://{repl_setting('WEB_LISTEN')}"
        server_name = options["server_name"] or repl_setting("SERVER_NAME")
        try:
            instance_urls = parse_instance_map(repl_setting("REPLICATION_INSTANCE_MAP"))
        except ValueError as e:
            raise CommandError(f"REPLICATION_INSTANCE_MAP: {e}") from None
        for value in options["instance_url"]:
            try:
                instance_urls.update(parse_instance_map(value))
            except ValueError as e:
                raise CommandError(f"--instance-url: {e}") from None
        streams = list(STREAMS)
        if options["streams"]:
            streams = [s.strip() for s in options["streams"].split(",") if s.strip()]
            unknown = sorted(set(streams) - set(STREAMS))
            if unknown:
                raise CommandError(f"unknown stream(s) {', '.join(unknown)}; known: {', '.join(STREAMS)}")
        if use_redis:
            redis_url = options["redis_url"] or getattr(settings, "REDIS_URL", "")
            if not redis_url:
                raise CommandError("--redis needs a Redis: pass --redis-url URL or set REDIS_URL")
            where = f"redis {redact_url(redis_url)} channel {server_name!r}"
        else:
            host, port = split_listen(options["connect"] or repl_setting("REPLICATION_LISTEN"),
                                      "--connect")
            where = f"{host}:{port} ({server_name})"
        sink = JsonlSink(options["jsonl"], options["jsonl_timestamps"]) if options["jsonl"] else None
        # The same REPLICATION_SECRET as the web process (on the embedded default: the one
        # generated into STATE_DIR), and its catch-up range and page caps (docs/security.md).
        common = dict(name=options["name"], server_name=server_name, catchup_url=catchup_url,
                      instance_urls=instance_urls,
                      streams=streams, on_facts=sink,
                      initial_tokens=sink.positions if sink else None,
                      replication_secret=settings.REPLICATION_SECRET,
                      catchup_max_range=int(repl_setting("REPLICATION_CATCHUP_MAX_RANGE")),
                      catchup_page_limit=int(repl_setting("REPLICATION_CATCHUP_MAX_LIMIT")))
        try:
            if use_redis:
                worker: BaseReplicationWorker = RedisReplicationWorker(redis_url=redis_url, **common)
            else:
                worker = ReplicationWorker(host=host, port=port, ssl=client_context_from_settings(),
                                           **common)
        except (ValueError, ImproperlyConfigured) as e:
            if sink:
                sink.close()
            raise CommandError(redact_text(str(e))) from e
        self.stdout.write(f"replication worker {options['name']}: {where}, "
                          f"catch-up {redact_url(catchup_url)}"
                          + "".join(f", {w} at {redact_url(u)}" for w, u in sorted(instance_urls.items()))
                          + f", streams {', '.join(streams)}\n")
        self.stdout.flush()
        try:
            asyncio.run(self._run(worker))
        finally:
            if sink:
                sink.close()

    @staticmethod
    async def _run(worker: BaseReplicationWorker) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)

        # Where it stands goes to the database (the Connections page, /metrics), never on
        # Synapse's Redis channel.
        transport = "redis" if isinstance(worker, RedisReplicationWorker) else "tcp"
        status = asyncio.create_task(publish_loop(worker, transport), name="worker-status")
        try:
            await worker.run()
        finally:
            status.cancel()
            await asyncio.gather(status, return_exceptions=True)
