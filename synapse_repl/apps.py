from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SynapseReplConfig(AppConfig):
    name = "synapse_repl"
    verbose_name = _("Service")
    default_auto_field = "django.db.models.BigAutoField"
