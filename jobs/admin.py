"""Batch-job runs in the admin, read-only, as the runner recorded them."""
from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from common.breakable import breakable
from jobs.models import JobRun
from streams.admin import ReadOnlyAdmin


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyAdmin):
    """Batch-job runs, as the runner recorded them (start one from the dashboard)."""

    list_display = ("id", "job", "outcome", "trigger", "started_at", "duration", "rows_in", "rows_out", "differences")
    list_filter = ("job", "status", "trigger")
    readonly_fields = ("job", "parameters", "outcome", "trigger", "started_at", "ended_at", "rows_in", "rows_out",
                       "differences", "difference_table", "error")
    fields = readonly_fields  # the raw sample and status stay out: the table and outcome say it better

    @admin.display(description=_("status"), ordering="status")
    def outcome(self, run: JobRun):
        """A check with differences reads as failed (in red), not like a clean one."""
        colour = {"failed": "#b3261e", "refused": "#b3261e", "succeeded": "#2b8a3e"}.get(run.verdict, "inherit")
        return format_html('<span class="status-{}" style="color: {}; font-weight: 600">{}</span>',
                           run.verdict, colour, run.verdict_text)

    @admin.display(description=_("first differences"))
    def difference_table(self, run: JobRun):
        columns, rows = run.shown_differences()
        if not rows:
            return "—"
        return format_html(
            '<p>first {} of {} (<a href="{}">all kept findings</a>)</p><div class="scroll-x"><table class="differences">'
            '<thead><tr>{}</tr></thead><tbody>{}</tbody></table></div>',
            len(rows), run.differences, reverse("dashboard:job-findings", args=[run.pk]),
            format_html_join("", "<th>{}</th>", ((c,) for c in columns)),
            format_html_join("", "<tr>{}</tr>", ((format_html_join("", "<td>{}</td>", ((breakable(v),) for v in row)),)
                                                 for row in rows)))

    @admin.display(description=_("duration (s)"))
    def duration(self, run: JobRun):
        return None if run.duration_seconds is None else round(run.duration_seconds, 1)
