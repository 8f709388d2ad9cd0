"""The record of each batch-job run (jobs): what ran, on what, how it ended."""
from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class JobRun(models.Model):
    """One run of a batch job, written by the runner, never by the job itself."""

    class Status(models.TextChoices):
        #: started from the dashboard in full mode: waiting for a Celery worker to take it
        QUEUED = "queued", _("queued")
        RUNNING = "running", _("running")
        SUCCEEDED = "succeeded", _("succeeded")
        FAILED = "failed", _("failed")
        #: another run of the same job held its lock: nothing was done
        REFUSED = "refused", _("refused (already running)")
        #: someone asked for a cancel (dashboard or ``cancel_job``) and the job process stopped
        CANCELLED = "cancelled", _("cancelled")

    job = models.CharField(_("job"), max_length=64, db_index=True)
    parameters = models.JSONField(_("parameters"), default=dict)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.RUNNING)
    trigger = models.CharField(_("started by"), max_length=64, default="manual")
    started_at = models.DateTimeField(_("started at"))
    ended_at = models.DateTimeField(_("ended at"), null=True, blank=True)
    rows_in = models.BigIntegerField(_("rows read"), null=True, blank=True)
    rows_out = models.BigIntegerField(_("rows written"), null=True, blank=True)
    #: consistency checks: how many differences, and the first of them
    differences = models.BigIntegerField(_("differences found"), null=True, blank=True)
    difference_sample = models.JSONField(_("first differences"), default=list, blank=True)
    error = models.TextField(_("error"), blank=True, default="")
    #: live progress from Spark's status tracker, rewritten every few seconds by the job process
    #: ({"stages": [{"id", "name", "tasks", "done", "active", "failed"}], "updated_at": iso})
    progress = models.JSONField(_("progress"), default=dict, blank=True)
    #: set by whoever wants the run stopped; the job process polls it and cancels its job group
    cancel_requested = models.BooleanField(_("cancel requested"), default=False)
    #: the driver's web UI while the run is alive (empty once it ends)
    spark_ui_url = models.CharField(_("Spark UI"), max_length=255, blank=True, default="")
    #: the process running the job (set by it when it starts): where the liveness sweep looks
    #: (jobs/liveness.py) for a run whose process is gone
    host = models.CharField(_("host"), max_length=255, blank=True, default="")
    pid = models.IntegerField(_("process id"), null=True, blank=True)
    #: rewritten by the running process every few seconds; a run on another host whose
    #: heartbeat is older than JOBS_HEARTBEAT_STALE_SECONDS is taken for dead
    heartbeat_at = models.DateTimeField(_("last heartbeat"), null=True, blank=True)

    class Meta:
        db_table = "job_runs"
        ordering = ["-started_at", "-id"]
        verbose_name = _("job run")
        verbose_name_plural = _("job runs")

    def __str__(self) -> str:
        return f"{self.job} #{self.pk} ({self.verdict_text})"  # a page's title agrees with its list

    @property
    def duration_seconds(self) -> float | None:
        if self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()

    #: how many differences the dashboard and the admin show in a run's table
    SHOWN_DIFFERENCES = 10

    @property
    def verdict(self) -> str:
        """The status an operator should read: a check that found differences finished its
        work but failed its purpose, so it is shown as failed, never like a clean one."""
        if self.status == self.Status.SUCCEEDED and self.differences:
            return "failed"
        return self.status

    @property
    def verdict_text(self) -> str:
        if self.status == self.Status.SUCCEEDED and self.differences:
            return f"failed: {self.differences} difference{'s' if self.differences != 1 else ''}"
        return str(self.get_status_display())

    def shown_differences(self) -> tuple[list[str], list[list[str]]]:
        """The first differences as (columns, rows) for a small table."""
        return self.difference_table(limit=self.SHOWN_DIFFERENCES)

    def difference_table(self, limit: int | None = None, room: str | None = None) -> tuple[list[str], list[list[str]]]:
        """The kept differences (all, or the first ``limit``; only ``room``'s if given) as
        (columns, rows): the IDs, an audit's kind of finding and key, and the two sides first,
        then the rest by name."""
        sample = [d for d in (self.difference_sample or []) if isinstance(d, dict)
                  and (room is None or d.get("room_id") == room)][:limit]
        keys = {k for d in sample for k in d}  # the stored JSON keeps no key order: put IDs first
        first = [k for k in ("room_id", "event_id", "user_id", "finding", "key", "expected", "found") if k in keys]
        columns = first + sorted(keys - set(first))
        return columns, [["" if d.get(c) is None else str(d.get(c)) for c in columns] for d in sample]
