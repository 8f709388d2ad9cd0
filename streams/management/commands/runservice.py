"""``manage.py runservice``: serve this process (what ``make run`` starts).

Serves the web UI and the admin with daphne on ``WEB_LISTEN``. Later parts (the replication
listener, demo traffic) start from here too.
"""
from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from streams.conf import instance_name, repl_setting


def split_listen(value: str, name: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"{name}={value!r}: expected host:port, e.g. 127.0.0.1:8000")
    return host.strip("[]"), int(port)


class Command(BaseCommand):
    help = "Serve the web UI and admin (daphne, ASGI) on WEB_LISTEN."

    def handle(self, *args, **options) -> None:
        from daphne.cli import CommandLineInterface

        host, port = split_listen(repl_setting("WEB_LISTEN"), "WEB_LISTEN")
        db = settings.DATABASES["default"]
        mode = "embedded (SQLite)" if db["ENGINE"].endswith("sqlite3") else "full (PostgreSQL)"
        self.stdout.write(
            f"synapse_repl {instance_name()} on {repl_setting('SERVER_NAME')}, {mode} mode\n"
            f"  web UI:  http://{host}:{port}/\n"
            f"  admin:   http://{host}:{port}/admin/  (create a user: python manage.py createsuperuser)\n"
        )
        self.stdout.flush()
        CommandLineInterface().run(["-b", host, "-p", str(port), "--proxy-headers",
                                    "synapse_repl.asgi:application"])
