"""``manage.py replication_worker``: follow the replication streams as a worker (docs/replication.md).

Connects to a replication endpoint (``runreplication``), applies ``caches`` rows to the local
Django cache and, with ``--jsonl``, appends every fact it receives to a file as one JSON line
``{"stream", "writer", "token", "rows"}``. That file is also the worker's memory: on start the
last token per (stream, writer) found in it is where the worker resumes, so restarting with
the same file neither repeats nor skips a fact. Stops cleanly on SIGTERM/SIGINT.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from streams.conf import repl_setting
from streams.management.commands.runservice import split_listen
from streams.registry import STREAMS
from streams.replication.worker import ReplicationWorker


class JsonlSink:
    """Appends facts to a JSON-lines file, flushed per line (readers may tail it).

    Called from each stream's own thread, hence the lock.
    """

    def __init__(self, path: str) -> None:
        self.path = path
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
        line = json.dumps({"stream": stream, "writer": writer, "token": token, "rows": rows},
                          separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class Command(BaseCommand):
    help = "Follow the replication streams of a replication endpoint (a worker process)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--name", required=True, help="this worker's instance name")
        parser.add_argument("--connect", default=None, metavar="HOST:PORT",
                            help="replication endpoint (default: REPLICATION_LISTEN)")
        parser.add_argument("--catchup-url", default=None, metavar="URL",
                            help="base URL of the catch-up endpoint (default: http://WEB_LISTEN)")
        parser.add_argument("--server-name", default=None,
                            help="expected SERVER name (default: SERVER_NAME)")
        parser.add_argument("--streams", default=None, metavar="A,B",
                            help="follow only these streams (default: all)")
        parser.add_argument("--jsonl", default=None, metavar="PATH",
                            help="append each fact to PATH as a JSON line; resume from it")

    def handle(self, *args, **options) -> None:
        host, port = split_listen(options["connect"] or repl_setting("REPLICATION_LISTEN"), "--connect")
        catchup_url = options["catchup_url"] or f"http://{repl_setting('WEB_LISTEN')}"
        server_name = options["server_name"] or repl_setting("SERVER_NAME")
        streams = list(STREAMS)
        if options["streams"]:
            streams = [s.strip() for s in options["streams"].split(",") if s.strip()]
            unknown = sorted(set(streams) - set(STREAMS))
            if unknown:
                raise CommandError(f"unknown stream(s) {', '.join(unknown)}; known: {', '.join(STREAMS)}")
        sink = JsonlSink(options["jsonl"]) if options["jsonl"] else None
        worker = ReplicationWorker(
            name=options["name"], host=host, port=port, server_name=server_name,
            catchup_url=catchup_url, streams=streams, on_facts=sink,
            initial_tokens=sink.positions if sink else None,
        )
        self.stdout.write(f"replication worker {options['name']}: {host}:{port} ({server_name}), "
                          f"catch-up {catchup_url}, streams {', '.join(streams)}\n")
        self.stdout.flush()
        try:
            asyncio.run(self._run(worker))
        finally:
            if sink:
                sink.close()

    @staticmethod
    async def _run(worker: ReplicationWorker) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()
