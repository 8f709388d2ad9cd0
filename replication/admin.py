"""What the endpoints recorded of workers' users (``user_ips``), read-only in the admin."""
from __future__ import annotations

import datetime

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from replication.models import UserIp
from streams.admin import ReadOnlyAdmin, input_filter


@admin.register(UserIp)
class UserIpAdmin(ReadOnlyAdmin):
    """Where each user's clients were last seen (USER_IP from the workers, written in batches
    by the replication endpoints). Access tokens are not shown: only their last characters."""

    list_display = ("user_id", "ip", "device_id", "user_agent", "last_seen_at", "token_tail")
    list_filter = (input_filter(_("user"), "by_user_id", "user_id"), input_filter(_("IP address"), "by_ip", "ip"),
                   input_filter(_("device"), "by_device_id", "device_id"))
    search_fields = ("user_id", "ip", "device_id")
    exclude = ("access_token",)
    readonly_fields = ("token_tail", "last_seen_at")
    ordering = ("-last_seen",)
    list_per_page = 50
    show_full_result_count = False

    @admin.display(description=_("last seen"), ordering="last_seen")
    def last_seen_at(self, row: UserIp):
        try:
            return datetime.datetime.fromtimestamp(row.last_seen / 1000, datetime.timezone.utc)
        except (OverflowError, OSError, ValueError):  # a peer's odd clock: show the number
            return row.last_seen

    @admin.display(description=_("access token"))
    def token_tail(self, row: UserIp) -> str:
        return "…" + row.access_token[-4:] if len(row.access_token) > 8 else "…"
