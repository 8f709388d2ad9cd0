"""What the observer of a live Synapse hands to the web processes (docs/attach.md)."""
from django.db import models
from django.utils.translation import gettext_lazy as _


class ObserverStatus(models.Model):
    """The latest live view of one running observer (``manage.py synapse_observer``), written
    by it every few seconds and read by ``/status.json`` and ``/metrics`` in any web process.
    It holds what was heard on Synapse's Redis; Synapse's database is never written."""

    name = models.CharField(_("name"), max_length=255, primary_key=True)
    pid = models.IntegerField(_("process ID"))
    subscribed = models.BooleanField(_("subscribed"), default=False)
    updated_at = models.DateTimeField(_("updated at"))
    #: :meth:`synapse_attach.observer.SynapseObserver.as_dict` at ``updated_at``
    view = models.JSONField(_("view"), default=dict)

    class Meta:
        db_table = "synapse_attach_observer_status"
        verbose_name = _("Synapse observer")
        verbose_name_plural = _("Synapse observers")

    def __str__(self) -> str:
        return self.name
