"""``manage.py cancel_job RUN_ID``: ask a running job to stop; its process cancels its Spark jobs."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from jobs.models import JobRun


class Command(BaseCommand):
    help = "Cancel a running job run (its id is on the dashboard's jobs panel and in run_job's output)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", type=int, help="the JobRun id")

    def handle(self, *args, run_id: int, **options) -> None:
        try:
            run = JobRun.objects.get(pk=run_id)
        except JobRun.DoesNotExist:
            raise CommandError(f"no job run #{run_id}") from None
        if run.status != JobRun.Status.RUNNING:
            raise CommandError(f"run #{run_id} ({run.job}) is not running: it is {run.status}")
        JobRun.objects.filter(pk=run_id).update(cancel_requested=True)
        self.stdout.write(f"cancel requested for run #{run_id} ({run.job}); its process stops it within seconds")
