"""Batch jobs: Spark computations that recompute and check what was stored, each run
recorded as a ``JobRun``; Celery only launches them (docs/jobs.md)."""
