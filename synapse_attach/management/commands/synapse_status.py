"""``manage.py synapse_status [--json]``: where every stream of the attached Synapse stands, read
once from its database (docs/attach.md)."""
from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from synapse_attach.reader import AttachError, AttachSettings, take_snapshot
from synapse_attach.status import format_text, report


class Command(BaseCommand):
    help = ("Print every stream of the Synapse at SYNAPSE_DATABASE_URL (read-only): writers and their "
            "positions, persisted-upto, sequence, largest stored ID, and the sequence doctor's findings.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="one JSON document instead of text")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = report(take_snapshot(AttachSettings.from_settings(settings.SYNAPSE_ATTACH)))
        except AttachError as e:
            raise CommandError(str(e)) from None
        if options["json"]:
            self.stdout.write(json.dumps(result.as_dict(), indent=2))
        else:
            self.stdout.write(format_text(result))
