"""Tables that track where each stream stands (not facts: these rows do change)."""
from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class StreamPosition(models.Model):
    """Synapse's ``stream_positions``: the last position each writer recorded, plus when and
    by which process it last advanced (null on rows from before that was recorded)."""

    stream_name = models.CharField(_("stream"), max_length=255)
    instance_name = models.CharField(_("writer"), max_length=255)
    stream_id = models.BigIntegerField(_("position"))
    recorded_at = models.DateTimeField(_("last write"), null=True, blank=True)
    pid = models.IntegerField(_("process ID"), null=True, blank=True)
    host = models.CharField(_("host"), max_length=255, null=True, blank=True)
    #: when the process that last wrote as this writer closed it cleanly (nothing pending);
    #: null while it runs, and for a process that died or was killed
    exited_at = models.DateTimeField(_("exited cleanly at"), null=True, blank=True)

    class Meta:
        db_table = "stream_positions"
        verbose_name = _("stream position")
        verbose_name_plural = _("stream positions")
        constraints = [
            models.UniqueConstraint(fields=["stream_name", "instance_name"], name="stream_positions_idx")
        ]

    def __str__(self) -> str:
        return f"{self.stream_name}/{self.instance_name} @ {self.stream_id}"


class StreamReservation(models.Model):
    """Stream IDs a writer has reserved and not yet completed.

    Written in the same round trip that reserves the IDs and removed when they complete, so
    the pending set of every writer is visible to every process, and an ID whose writer died
    mid-transaction stays visible (and is reported as stuck) until that writer restarts.
    """

    stream_name = models.CharField(_("stream"), max_length=255)
    instance_name = models.CharField(_("writer"), max_length=255)
    stream_ids = models.JSONField(_("stream IDs"))
    reserved_at = models.DateTimeField(_("reserved at"))
    pid = models.IntegerField(_("process ID"))

    class Meta:
        db_table = "stream_reservations"
        verbose_name = _("pending stream ID reservation")
        verbose_name_plural = _("pending stream ID reservations")
        indexes = [models.Index(fields=["stream_name", "instance_name"], name="stream_reservations_idx")]

    def __str__(self) -> str:
        return f"{self.stream_name}/{self.instance_name} {self.stream_ids}"


class StreamSequence(models.Model):
    """The ID table that stands in for a PostgreSQL sequence on SQLite (one writer)."""

    name = models.CharField(_("sequence"), max_length=255, primary_key=True)
    last_value = models.BigIntegerField(_("last value"))

    class Meta:
        db_table = "stream_sequences"
        verbose_name = _("stream ID table (SQLite)")
        verbose_name_plural = _("stream ID tables (SQLite)")

    def __str__(self) -> str:
        return f"{self.name} = {self.last_value}"
