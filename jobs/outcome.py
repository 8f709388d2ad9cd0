"""What a job hands back to the runner, and the shape every job function has."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

#: at most this many differences are kept with a run (``JobRun.difference_sample``)
SAMPLE_LIMIT = 1000


@dataclass
class Outcome:
    """What a job reports back: rows read and written, and any differences it found."""

    rows_in: int = 0
    rows_out: int = 0
    differences: int | None = None
    sample: list[dict[str, Any]] = field(default_factory=list)


def counted_sample(rows: Any, ordered: Callable[[Any], Any]) -> tuple[int, list[dict[str, Any]]]:
    """How many rows the DataFrame ``rows`` holds, and the first :data:`SAMPLE_LIMIT` of them
    as ``ordered`` sorts them: one Spark action while they are fewer than that (a healthy
    store's check finds none), which then holds the count too; only a full sample is followed
    by a count, of the rows cached meanwhile. (A count first, then the sample, was two Spark
    jobs every time, each planned and run apart.)"""
    rows = rows.cache()
    try:
        sample = [r.asDict() for r in ordered(rows).limit(SAMPLE_LIMIT).collect()]
        n = len(sample) if len(sample) < SAMPLE_LIMIT else rows.count()
    finally:
        rows.unpersist()
    return n, sample


#: a job: ``(spark, rooms or None) -> Outcome``
Job = Callable[[Any, Sequence[str] | None], Outcome]
