"""What the dashboard needs to remember across processes."""
from django.db import models
from django.utils.translation import gettext_lazy as _


class EndpointStatus(models.Model):
    """The latest snapshot of one replication endpoint's connections, written by that
    endpoint (``runreplication``, another process) and read by the web process's live feed
    and /metrics. One row per endpoint (host and listen address); a restart replaces it."""

    endpoint = models.CharField(_("endpoint"), max_length=255, primary_key=True)
    server_name = models.CharField(_("server name"), max_length=255)
    pid = models.IntegerField(_("process ID"))
    updated_at = models.DateTimeField(_("updated at"))
    snapshot = models.JSONField(_("snapshot"))

    class Meta:
        db_table = "dashboard_endpoint_status"
        verbose_name = _("replication endpoint")
        verbose_name_plural = _("replication endpoints")

    def __str__(self) -> str:
        return self.endpoint


class FactsPerMinute(models.Model):
    """A stream's facts total at the start of one minute, so the facts/s chart can look back
    a day after an incident (the live chart keeps 5 minutes in memory). Written by whichever
    process samples first that minute (the endpoint, a live feed); pruned after
    :data:`dashboard.facts_history.RETENTION`."""

    stream = models.CharField(_("stream"), max_length=64)
    minute = models.DateTimeField(_("minute"))
    facts_total = models.BigIntegerField(_("facts written so far"))

    class Meta:
        db_table = "dashboard_facts_per_minute"
        constraints = [models.UniqueConstraint(fields=["minute", "stream"], name="facts_per_minute_unique")]
        verbose_name = _("facts per minute sample")
        verbose_name_plural = _("facts per minute samples")

    def __str__(self) -> str:
        return f"{self.stream} {self.minute:%Y-%m-%d %H:%M}"


class WorkerStatus(models.Model):
    """Where one replication worker stands, written by that worker (``replication_worker``,
    TCP or Redis) every few seconds. Workers following over Redis tell no endpoint who they
    are, and nothing but what Synapse sends may go on its channel, so they report here."""

    name = models.CharField(_("name"), max_length=255, primary_key=True)
    transport = models.CharField(_("transport"), max_length=16)
    pid = models.IntegerField(_("process ID"))
    connected = models.BooleanField(_("connected"), default=False)
    updated_at = models.DateTimeField(_("updated at"))
    #: ``{stream: {writer: token}}``: the last token the worker applied per writer
    positions = models.JSONField(_("positions"), default=dict)
    #: what the worker's process costs (:func:`dashboard.process_stats.process_stats`)
    process = models.JSONField(_("process"), default=dict)

    class Meta:
        db_table = "dashboard_worker_status"
        verbose_name = _("replication worker")
        verbose_name_plural = _("replication workers")

    def __str__(self) -> str:
        return self.name
