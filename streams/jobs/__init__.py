"""Batch jobs: PySpark recomputations of what the persist path computes event by event.

Each job is a pure ``DataFrame -> DataFrame`` function (``topology``, ``visibility``,
``consistency``) plus a thin I/O shell (``io``); ``runner`` records a :class:`JobRun` and holds
the job's lock; Celery tasks (``streams.tasks``) only launch the runner. Design: docs/jobs.md.
"""
