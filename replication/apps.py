from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ReplicationConfig(AppConfig):
    name = "replication"
    verbose_name = _("Replication")
    default_auto_field = "django.db.models.BigAutoField"
