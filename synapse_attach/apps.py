"""The read-only observer of a live Synapse (docs/attach.md). It has no models: everything it
knows is read from Synapse's own database over connections of its own, never Django's."""
from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SynapseAttachConfig(AppConfig):
    name = "synapse_attach"
    verbose_name = _("Attached Synapse")
