"""``manage.py runservice``: what ``make run`` starts.

The web UI, the admin and the catch-up endpoint (daphne, ASGI) on ``WEB_LISTEN``, and beside
it the TCP replication endpoint (``runreplication``) on ``REPLICATION_LISTEN``, as a child
process that lives and dies with this one. Before serving it ensures the superuser operators
sign in with (``ensure_admin``), and on the embedded default starts the demo trickle
(``manage.py demo``; ``DEMO=0`` turns it off, full mode never has it).
"""
from __future__ import annotations

import atexit
import os
import subprocess
import sys

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from streams.conf import instance_name, repl_setting


def split_listen(value: str, name: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"{name}={value!r}: expected host:port, e.g. 127.0.0.1:8000")
    return host.strip("[]"), int(port)


class Command(BaseCommand):
    help = "Serve the web UI (WEB_LISTEN) and the TCP replication endpoint (REPLICATION_LISTEN)."

    def handle(self, *args, **options) -> None:
        from daphne.cli import CommandLineInterface

        from synapse_repl.security import HOW_TO_SET_A_SECRET
        from synapse_repl.startup import check_startable

        if not settings.REPLICATION_SECRET:
            raise CommandError(HOW_TO_SET_A_SECRET)
        host, port = split_listen(repl_setting("WEB_LISTEN"), "WEB_LISTEN")
        rhost, rport = split_listen(repl_setting("REPLICATION_LISTEN"), "REPLICATION_LISTEN")
        check_startable(database=True, redis=True,
                        listen=((host, port, "WEB_LISTEN"), (rhost, rport, "REPLICATION_LISTEN")))
        from dashboard.management.commands.demo import embedded_default

        replication = subprocess.Popen([sys.executable, "manage.py", "runreplication"], cwd=settings.BASE_DIR)
        atexit.register(replication.terminate)
        jobs = start_job_worker()
        mode = "embedded (SQLite)" if embedded_default() else "full"
        self.stdout.write(
            f"synapse_repl {instance_name()} on {repl_setting('SERVER_NAME')}, {mode} mode\n"
            f"  web UI:  http://{host}:{port}/   (connections: /connections/, metrics: /metrics)\n"
            f"  replication (TCP): {rhost}:{rport}\n"
            f"  batch jobs: {jobs}\n"
            f"  admin:   http://{host}:{port}/admin/"
        )
        call_command("ensure_admin", stdout=self.stdout)
        if embedded_default() and settings.DASHBOARD["DEMO"]:
            demo = subprocess.Popen([sys.executable, "manage.py", "demo"], cwd=settings.BASE_DIR)
            atexit.register(demo.terminate)
            self.stdout.write("  demo:    a small dataset and a trickle of demo facts (DEMO=0 turns it off)")
        self.stdout.flush()
        # Trust X-Forwarded-For only behind a reverse proxy: it decides who /metrics admits.
        proxy = ["--proxy-headers"] if os.environ.get("PROXY_HEADERS", "") in ("1", "true", "yes") else []
        CommandLineInterface().run(["-b", host, "-p", str(port), *proxy, "synapse_repl.asgi:application"])


def start_job_worker() -> str:
    """With Redis, a Celery worker with beat (nightly/hourly jobs) beside the service, unless
    ``JOBS_WORKER=0``; without Redis, Celery runs jobs eagerly in the calling process."""
    import os

    if not settings.REDIS_URL:
        return "in process (Celery eager; manage.py run_job JOB)"
    if os.environ.get("JOBS_WORKER", "1") == "0":
        return "JOBS_WORKER=0: run `celery -A synapse_repl worker -B` elsewhere"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "synapse_repl", "worker", "-B", "--concurrency", "1",
         "--loglevel", "INFO", "--schedule", str(settings.STATE_DIR / "celerybeat-schedule")],
        cwd=settings.BASE_DIR,
    )
    atexit.register(worker.terminate)
    return f"Celery worker + beat (pid {worker.pid}) on {settings.REDIS_URL}"
