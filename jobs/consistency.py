"""Differences between what a job computes and what the persist path stored: pure
``DataFrame -> DataFrame`` comparisons, one row per difference."""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

DIFFERENCE_SCHEMA = "room_id string, event_id string, user_id string, expected string, found string"


def ordering_differences(expected: DataFrame, stored: DataFrame) -> DataFrame:
    """``expected`` and ``stored`` (room_id, event_id, topological_ordering) -> differences,
    including an event present on one side only."""
    e, s = expected.alias("e"), stored.alias("s")
    joined = e.join(s, on=["event_id"], how="full_outer")
    return (
        joined.where(~F.col("e.topological_ordering").eqNullSafe(F.col("s.topological_ordering")))
        .select(
            F.coalesce(F.col("e.room_id"), F.col("s.room_id")).alias("room_id"),
            F.col("event_id"),
            F.lit(None).cast("string").alias("user_id"),
            F.col("e.topological_ordering").cast("string").alias("expected"),
            F.col("s.topological_ordering").cast("string").alias("found"),
        )
    )
