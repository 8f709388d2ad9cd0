"""``bench_storage``'s build record: how far the build of a kept dataset got, so that a later
run continues it instead of starting again (a 10 M-event build outlasts a working session).

``D/build.json`` holds the dataset's arguments, the phase, the batches and events persisted,
the time and CPU spent inside ``persist_events`` so far, the rate of every finished million
and slice (with the load average seen during it and the sessions that built it) and the
unfinished ones' running sums. It is rewritten after every committed batch, atomically (a
temporary file renamed over it), so a build killed at any moment finds a record at most one
batch behind the database (:func:`skip_stored` accepts such whole batches, untimed).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

RECORD = "build.json"

#: the phases of a build, in order
PHASES = ("persist", "baseline", "live", "analyze", "done")


class BuildRefused(Exception):
    """A kept directory whose build cannot be continued by this run (its message says why)."""


def _span() -> dict[str, Any]:
    """A million or slice being built: timed events and seconds, the load seen, the sessions."""
    return {"n": 0, "s": 0.0, "load_sum": 0.0, "load_max": 0.0, "batches": 0, "sessions": []}


def _add(span: dict[str, Any], n: int, seconds: float, load: float, session: int) -> None:
    span["n"] += n
    span["s"] += seconds
    span["load_sum"] += load
    span["load_max"] = max(span["load_max"], load)
    span["batches"] += 1
    if session not in span["sessions"]:
        span["sessions"].append(session)


def _closed(span: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"rate": span["n"] / span["s"] if span["s"] else 0.0, "timed_events": span["n"],
            "load_mean": span["load_sum"] / span["batches"] if span["batches"] else 0.0,
            "load_max": span["load_max"], "sessions": list(span["sessions"]), **extra}


class BuildRecord:
    """The record of one dataset's build; ``directory`` None: kept in memory only (a
    throwaway database)."""

    def __init__(self, directory: Path | None, dataset: dict[str, Any], *, slice_size: int) -> None:
        self.directory = directory
        self.data: dict[str, Any] = {
            "dataset": dataset, "phase": "persist", "slice_size": slice_size,
            "batches": 0, "written": 0, "untimed": 0,
            "in_persist": 0.0, "cpu_here": 0.0, "cpu_database": 0.0, "gc_s": 0.0, "wall_s": 0.0,
            "per_million": [], "million": _span(), "slices": [], "slice": _span(),
            "sessions": [], "baseline": None, "since": None, "live_batches": 0, "live_written": 0,
        }

    # -- the file ---------------------------------------------------------------------------

    @classmethod
    def load(cls, directory: Path) -> "BuildRecord | None":
        try:
            data = json.loads((directory / RECORD).read_text())
        except FileNotFoundError:
            return None
        except ValueError as e:  # never half-written (renamed into place), but say so if it is
            raise BuildRefused(f"{directory / RECORD} is not a build record ({e}); delete the directory to "
                               "build again") from None
        record = cls(directory, data["dataset"], slice_size=data["slice_size"])
        record.data = data
        return record

    def save(self) -> None:
        """Write the record atomically: a reader (a later run) sees the old or the new one."""
        if self.directory is None:
            return
        path = self.directory / RECORD
        tmp = path.with_name(RECORD + ".tmp")
        with open(tmp, "w") as f:
            json.dump(self.data, f)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    # -- what it says -----------------------------------------------------------------------

    @property
    def phase(self) -> str:
        return self.data["phase"]

    @phase.setter
    def phase(self, value: str) -> None:
        assert value in PHASES
        self.data["phase"] = value

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value

    def stored_events(self) -> int:
        """The dataset's events the database should hold (the baseline's bare rows apart)."""
        return self.data["written"] + self.data["live_written"]

    def begin_session(self, **settings: Any) -> int:
        """A new run continues the build; returns its number (1 for the first)."""
        self.data["sessions"].append({"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                      "phase": self.phase, "from_events": self.data["written"],
                                      "load_average": round(os.getloadavg()[0], 2), **settings})
        return len(self.data["sessions"])

    def end_session(self, **figures: Any) -> None:
        self.data["sessions"][-1].update(to_events=self.data["written"], phase_at_end=self.phase, **figures)

    # -- the persist phase --------------------------------------------------------------------

    def persisted(self, n: int, *, seconds: float, cpu_here: float, cpu_database: float, gc_s: float,
                  wall_s: float, load: float, session: int) -> tuple[dict | None, dict | None]:
        """One committed batch of ``n`` events of the persist phase; returns the million and
        the slice it closed (None: none), to be completed by the caller with what it measures
        there (:meth:`close_million`)."""
        d = self.data
        d["batches"] += 1
        d["written"] += n
        for key, value in (("in_persist", seconds), ("cpu_here", cpu_here), ("cpu_database", cpu_database),
                           ("gc_s", gc_s), ("wall_s", wall_s)):
            d[key] += value
        _add(d["million"], n, seconds, load, session)
        _add(d["slice"], n, seconds, load, session)
        million = slice_ = None
        if d["written"] >= 1_000_000 * (len(d["per_million"]) + 1):
            million = _closed(d["million"], end=d["written"])
            d["million"] = _span()
        if d["written"] >= d["slice_size"] * (len(d["slices"]) + 1):
            slice_ = _closed(d["slice"], end=d["written"])
            d["slices"].append(slice_)
            d["slice"] = _span()
        return million, slice_

    def close_million(self, million: dict, **measured: Any) -> None:
        million.update(measured)
        self.data["per_million"].append(million)

    def untimed(self, batches: int, n: int) -> None:
        """Batches an earlier run committed after its last record: stored, not timed."""
        self.data["batches"] += batches
        self.data["written"] += n
        self.data["untimed"] += n

    def open_million(self) -> dict | None:
        """The unfinished million so far (None: nothing timed in it)."""
        m = self.data["million"]
        return _closed(m, end=self.data["written"]) if m["n"] else None


def skip_stored(batches: Iterator, *, recorded_batches: int, recorded_events: int, stored_events: int,
                what: str) -> tuple[int, int]:
    """Advance the regenerated ``batches`` past what the database already holds.

    The record says ``recorded_batches`` batches (``recorded_events`` events) were stored; the
    database holds ``stored_events``. More is accepted only as whole batches after the
    recorded ones (committed by a run killed before it wrote its record); anything else is
    refused before this run writes. Returns (batches, events) stored beyond the record.
    """
    if stored_events < recorded_events:
        raise BuildRefused(f"the database holds {stored_events:,} events of the {what} but the build record says "
                           f"{recorded_events:,} were stored: the record is not this database's (delete the "
                           "directory to build again)")
    n = i = 0
    while n < stored_events:
        b = next(batches, None)
        if b is None:
            raise BuildRefused(f"the database holds {stored_events:,} events of the {what}, more than it has "
                               f"({n:,}): not this dataset's database (delete the directory to build again)")
        n += len(b.items)
        i += 1
        if i == recorded_batches and n != recorded_events:
            raise BuildRefused(f"the regenerated {what} has {n:,} events in its first {i:,} batches, the build "
                               f"record {recorded_events:,}: the generator changed since the build began "
                               "(build again in a new directory)")
    if n != stored_events or i < recorded_batches:
        raise BuildRefused(f"the database holds {stored_events:,} events of the {what}, not a whole number of "
                           f"batches ({n:,} after {i:,} batches; the record: {recorded_events:,} after "
                           f"{recorded_batches:,}): delete the directory to build again")
    return i - recorded_batches, n - recorded_events
