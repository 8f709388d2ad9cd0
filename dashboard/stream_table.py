"""Where every stream stands, as the web process shows it: the tables' records
(:func:`streams.stream_status.stream_status`) plus the streams this process keeps in memory (typing,
whose writer lives in the web process: no other process can tell its position)."""
from __future__ import annotations

from datetime import datetime

from streams.runtime import runtime
from streams.stream_status import StreamStatus, stream_status


def streams_as_served(now: datetime | None = None) -> list[StreamStatus]:
    return stream_status(now=now, in_memory=runtime().in_memory_positions())
