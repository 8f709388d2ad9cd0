"""The read-only observer of a live Synapse (docs/attach.md). What it reads of Synapse's own
database comes over connections of its own, never Django's; its one model keeps the live view
the observer heard on Synapse's Redis, for the web processes."""
from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SynapseAttachConfig(AppConfig):
    name = "synapse_attach"
    verbose_name = _("Attached Synapse")
