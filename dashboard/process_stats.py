"""What one process costs (CPU, resident memory, open files, garbage collections), read from
``/proc`` and the interpreter, so ``/metrics`` can show one set per process of the cluster:
the web process reads its own at scrape time; endpoints and workers send theirs with the
status rows they already publish (:mod:`dashboard.endpoint_status`, :mod:`dashboard.worker_status`).

The figures are those of prometheus-client's process and GC collectors (the panels operators
know from Synapse's dashboard), kept as a plain dict so that they travel in a JSON column.
"""
from __future__ import annotations

import gc
import os
import time
from typing import Any

#: bytes per page, for ``/proc/self/statm``
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
#: clock ticks per second, for the start time in ``/proc/self/stat``
TICKS = os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


def process_stats() -> dict[str, Any]:
    """This process's figures now: ``cpu_seconds`` (user + system), ``resident_bytes``,
    ``open_fds``, ``start_time`` (Unix time) and ``gc_collections`` per generation."""
    times = os.times()
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    with open("/proc/self/stat") as f:
        # the command name (field 2) may hold spaces: count fields after its closing paren
        after_name = f.read().rsplit(")", 1)[1].split()
    start_ticks = int(after_name[19])  # field 22, starttime
    return {
        "pid": os.getpid(),
        "cpu_seconds": round(times.user + times.system, 3),
        "resident_bytes": resident_pages * PAGE_SIZE,
        "open_fds": len(os.listdir("/proc/self/fd")),
        "start_time": round(_boot_time() + start_ticks / TICKS, 2),
        "gc_collections": [generation["collections"] for generation in gc.get_stats()],
        "sampled_at": round(time.time(), 3),
    }
