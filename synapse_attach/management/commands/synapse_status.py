"""``manage.py synapse_status [--json] [--listen SECONDS]``: where every stream of the attached
Synapse stands, read once from its database, and with ``--listen`` what its Redis said over
that many seconds (docs/attach.md)."""
from __future__ import annotations

import json
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from common.url_redaction import redact_url
from synapse_attach.observer import format_live
from synapse_attach.reader import AttachError, AttachSettings, take_snapshot
from synapse_attach.redis_observer import listen, redis_settings
from synapse_attach.status import format_text, report


class Command(BaseCommand):
    help = ("Print every stream of the Synapse at SYNAPSE_DATABASE_URL (read-only): writers and their "
            "positions, persisted-upto, sequence, largest stored ID, and the sequence doctor's findings; "
            "with --listen, also what SYNAPSE_REDIS_URL carried meanwhile (live positions, processes, "
            "stuck writers).")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="one JSON document instead of text")
        parser.add_argument("--listen", type=float, default=0.0, metavar="SECONDS",
                            help="listen to Synapse's Redis this long first (needs SYNAPSE_REDIS_URL "
                                 "and SYNAPSE_SERVER_NAME)")

    def handle(self, *args: Any, **options: Any) -> None:
        values = settings.SYNAPSE_ATTACH
        seconds = options["listen"]
        live: dict[str, Any] | None = None
        try:
            attach = AttachSettings.from_settings(values)
            if seconds < 0:
                raise AttachError("--listen: expected a number of seconds, 0 or more")
            if seconds:
                live = self._listen(values, seconds)
            result = report(take_snapshot(attach))
        except AttachError as e:
            raise CommandError(str(e)) from None
        if options["json"]:
            document = result.as_dict()
            if live is not None:
                document["live"] = live
            self.stdout.write(json.dumps(document, indent=2))
        else:
            self.stdout.write(format_text(result))
            if live is not None:
                self.stdout.write("\n" + format_live(live))

    @staticmethod
    def _listen(values: dict[str, Any], seconds: float) -> dict[str, Any]:
        try:
            url, server_name = redis_settings(values, "--listen")
        except ValueError as e:
            raise AttachError(str(e)) from None
        observer, redis = listen(url, server_name, seconds, stuck_after=float(values.get("STUCK_AFTER_SECONDS", 10.0)))
        if redis.subscriptions == 0:
            raise AttachError(f"could not subscribe to {redact_url(url)} within {seconds:g} s: {redis.last_loss}")
        view = observer.as_dict(time.monotonic())
        view["redis"] = {"url": redact_url(url), "channel": server_name, "subscriptions": redis.subscriptions}
        return view
