"""A job for the browser tests, loaded with ``JOB_MODULES=tests.dashboard.browser_jobs``: a real
Spark job on the run's session whose tasks take a minute each, so it is still running when the
test has seen its progress and pressed Cancel."""
from __future__ import annotations

import time

from jobs.outcome import Outcome


def endless(spark, rooms) -> Outcome:
    def slow(rows):
        time.sleep(60)
        return [sum(1 for _ in rows)]
    return Outcome(rows_in=sum(spark.sparkContext.parallelize(range(40), 4).mapPartitions(slow).collect()))


JOBS = {"test_endless": endless}
