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


#: a job: ``(spark, rooms or None) -> Outcome``
Job = Callable[[Any, Sequence[str] | None], Outcome]
