"""``manage.py run_job JOB [--rooms ROOM ...]``: run a batch job here and now."""
from __future__ import annotations

import logging
import os
import signal
import sys
from typing import NoReturn

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from dashboard.job_panel import job_names
from jobs.job_registry import JOBS, load_jobs
from jobs.models import JobRun
from jobs.monitor import interrupt_runs as interrupt
from jobs.monitor import summary
from jobs.runner import run_job
from jobs.session import stop_spark
from jobs.tasks import run_job_task
from synapse_repl.startup import check_startable


def silence_py4j() -> None:
    """py4j logs a broken gateway connection with its traceback; an interrupt breaks some."""
    logging.getLogger("py4j").setLevel(logging.CRITICAL + 1)


def interrupt_runs() -> bool:
    return interrupt()


def _job_names() -> list[str]:
    return job_names()


class Command(BaseCommand):
    @property
    def help(self) -> str:  # the job names as registered, never a stale list
        return f"Run a batch job in this process. JOB is one of: {', '.join(_job_names())}."

    def add_arguments(self, parser) -> None:
        parser.add_argument("job", metavar="JOB", help=f"the job to run: {', '.join(_job_names())}")
        parser.add_argument("--rooms", nargs="+", metavar="ROOM_ID", help="only these rooms")
        parser.add_argument("--via-celery", action="store_true",
                            help="send it to the Celery workers instead and wait for the result")
        parser.add_argument("--run", type=int, metavar="ID",
                            help="fill in this job run record (made by the process that launched this one)")

    def _progress(self, progress) -> None:
        """One line per change of the counts while the job runs (stderr: stdout is the result)."""

        line = summary(progress)
        if line != getattr(self, "_last_progress", None):
            self._last_progress = line
            self.stderr.write(f"progress: {line}")

    _interrupted = False

    def _interrupt(self, signum, frame) -> None:
        """Ctrl-C: the run's Spark work is stopped quietly and the run recorded failed
        ("interrupted"); a second Ctrl-C, or one before Spark's work began, stops at once."""
        silence_py4j()
        if self._interrupted or not interrupt_runs():
            raise KeyboardInterrupt
        self._interrupted = True

    def _exit_interrupted(self, job: str, run) -> NoReturn:
        """One line, Spark stopped without a word, exit status 130 (a shell's for SIGINT)."""

        silence_py4j()
        try:
            stop_spark()
        except Exception:  # on the way out: the JVM ends with this process anyway
            pass
        if run is None:
            self.stderr.write(f"run_job: interrupted; {job} recorded no run")
        else:
            why = " (interrupted)" if run.error.startswith("interrupted") else ""
            self.stderr.write(f"run_job: interrupted; {job} run #{run.pk} recorded {run.status}{why}")
        sys.exit(130)

    def handle(self, *args, job: str, rooms, via_celery: bool, run: int | None = None, **options) -> None:
        load_jobs()
        if job not in JOBS:
            raise CommandError(f"unknown job {job!r}; known: {', '.join(sorted(JOBS))}")
        # Spark starts a JVM in the process that runs the job: this one, unless Celery has a
        # broker (without REDIS_URL, Celery runs the task eagerly, here).
        here = not (via_celery and settings.REDIS_URL)
        check_startable(database=True, redis=via_celery, java=here)
        if via_celery:

            result = run_job_task.delay(job, rooms, trigger="run_job --via-celery").get()
            run = JobRun.objects.get(pk=result["run"])
        else:
            record = None
            if run is not None:
                try:
                    record = JobRun.objects.get(pk=run)
                except JobRun.DoesNotExist:
                    raise CommandError(f"no job run #{run}") from None
            previous = signal.signal(signal.SIGINT, self._interrupt)
            try:
                run = run_job(job, rooms, trigger="run_job", run=record, on_progress=self._progress)
            except KeyboardInterrupt:
                self._interrupted = True
                run = record or JobRun.objects.filter(job=job, pid=os.getpid()).first()
            except Exception as e:
                run = record or JobRun.objects.filter(job=job).first()
                raise CommandError(f"{job} failed (run #{run.pk if run else '?'}): {e}") from e
            finally:
                signal.signal(signal.SIGINT, previous)
            if self._interrupted:
                self._exit_interrupted(job, run)
        self.stdout.write(
            f"{run.job} run #{run.pk}: {run.status} in {run.duration_seconds or 0:.1f} s; "
            f"rows in {run.rows_in}, rows out {run.rows_out}"
            + (f", differences {run.differences}" if run.differences is not None else "")
        )
        for d in run.difference_sample[:20]:
            self.stdout.write(f"  {d}")
        if run.status in (JobRun.Status.REFUSED, JobRun.Status.FAILED):
            raise CommandError(run.error)
