"""Synapse's ``user_ips``: where and with what each user's clients were last seen.

Filled from ``USER_IP`` commands (docs/replication.md) by
:mod:`replication.endpoint.user_activity`, in batches. Not a fact table: a row is updated in
place whenever the same (user, access token, address) is seen again, as Synapse keys it."""
from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

#: Longest values stored; longer ones are refused where the command is recorded (a peer
#: cannot grow a row, or a PostgreSQL index entry, without bound).
MAX_USER_ID = 255
MAX_ACCESS_TOKEN = 512
MAX_IP = 64
MAX_DEVICE_ID = 255
#: User agents are cut to this length rather than refused (browsers send long ones).
MAX_USER_AGENT = 512


class UserIp(models.Model):
    user_id = models.CharField(_("user ID"), max_length=MAX_USER_ID)
    access_token = models.CharField(_("access token"), max_length=MAX_ACCESS_TOKEN)
    ip = models.CharField(_("IP address"), max_length=MAX_IP)
    user_agent = models.CharField(_("user agent"), max_length=MAX_USER_AGENT)
    device_id = models.CharField(_("device ID"), max_length=MAX_DEVICE_ID, null=True, blank=True)
    #: milliseconds since the epoch, as the command carries it
    last_seen = models.BigIntegerField(_("last seen (ms)"))

    class Meta:
        db_table = "user_ips"
        verbose_name = _("user IP")
        verbose_name_plural = _("user IPs")
        constraints = [
            # Synapse's upsert key (user_ips_user_token_ip_unique_index)
            models.UniqueConstraint(fields=["user_id", "access_token", "ip"], name="user_ips_user_token_ip_unique"),
        ]
        indexes = [
            models.Index(fields=["user_id", "last_seen"], name="user_ips_user_last_seen"),
            models.Index(fields=["last_seen"], name="user_ips_last_seen"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} from {self.ip}"
