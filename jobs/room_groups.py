"""Per-room work in Spark: two DataFrames cogrouped by room, a pandas function per room.

Rooms are independent, so they spread over the cores; but one Python call per room costs
Arrow conversions and a round trip to the Python worker, which dominates when most of
10,000 rooms have a hundred events. So rooms are hashed into a few buckets per core, each
bucket is one cogroup call, and the room split happens in pandas inside it. A room is never
split across buckets, so a room of a million events is still one call with all its rows.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import pandas as pd

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

BUCKETS_PER_CORE = 8


def cogroup_rooms(left: DataFrame, right: DataFrame, per_room: Callable[[pd.DataFrame, pd.DataFrame], pd.DataFrame],
                  schema: str, buckets: int | None = None) -> DataFrame:
    """``per_room(left rows of a room, right rows of the room)`` over every room of either side."""
    from pyspark.sql import functions as F

    if buckets is None:
        buckets = max(1, left.sparkSession.sparkContext.defaultParallelism * BUCKETS_PER_CORE)
    columns = [c.split()[0] for c in schema.split(",")]

    def run_bucket(lpdf: pd.DataFrame, rpdf: pd.DataFrame) -> pd.DataFrame:
        rights = dict(tuple(rpdf.groupby("room_id", sort=False))) if len(rpdf) else {}
        lefts = dict(tuple(lpdf.groupby("room_id", sort=False))) if len(lpdf) else {}
        out = []
        for room in lefts.keys() | rights.keys():
            got = per_room(lefts.get(room, lpdf.iloc[0:0]), rights.get(room, rpdf.iloc[0:0]))
            if len(got):
                out.append(got)
        if not out:  # object columns: an empty float64 column cannot become a string column
            return pd.DataFrame({c: pd.Series([], dtype=object) for c in columns})
        return pd.concat(out, ignore_index=True)[columns]

    bucket = (F.abs(F.hash("room_id")) % buckets).alias("_room_bucket")
    return (left.select(bucket, *left.columns).groupBy("_room_bucket")
            .cogroup(right.select(bucket, *right.columns).groupBy("_room_bucket"))
            .applyInPandas(lambda lhs, rhs: run_bucket(lhs.drop(columns="_room_bucket"), rhs.drop(columns="_room_bucket")),
                           schema=schema))
