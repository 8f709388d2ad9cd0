"""CPU and memory of processes, from ``/proc`` (Linux): what the benchmarks report and the
tests look at. Per process or per process tree, so a figure is immune to other load on the
machine; :func:`machine_busy` gives the whole machine's for context.
"""
from __future__ import annotations

import os

CLK_TCK = os.sysconf("SC_CLK_TCK")


def peak_rss_kib(pid: int) -> int | None:
    """The process's peak resident set size (``VmHWM``) in KiB; None once it is gone."""
    return status_field(pid, "VmHWM:")


def rss_kib(pid: int) -> int | None:
    """The process's resident set size now (``VmRSS``) in KiB; None once it is gone."""
    return status_field(pid, "VmRSS:")


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (all its threads); NaN once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return float("nan")


def minor_faults(pid: int) -> int | None:
    """The process's minor page faults so far (all its threads: pages the kernel mapped in
    on first touch, zeroed); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return None


def status_field(pid: int, key: str) -> int | None:
    """A number from ``/proc/<pid>/status`` (``VmRSS:`` in KiB, ``Threads:``...); None if gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def read_stat(pid: int) -> tuple[int, float] | None:
    """(ppid, CPU seconds of the process and its reaped children); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is the state (field 3); utime, stime, cutime, cstime are fields 14-17
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / CLK_TCK


def all_stats() -> dict[int, tuple[int, float]]:
    """:func:`read_stat` of every process on the machine."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


def tree_cpu(pid: int, stats: dict[int, tuple[int, float]]) -> float:
    """CPU seconds of ``pid`` and all its descendants, alive or reaped."""
    if pid not in stats:
        return 0.0
    total = stats[pid][1]
    children: dict[int, list[int]] = {}
    for p, (pp, _) in stats.items():
        children.setdefault(pp, []).append(p)
    stack = list(children.get(pid, []))
    while stack:
        p = stack.pop()
        total += stats[p][1]
        stack.extend(children.get(p, []))
    return total


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores), from ``/proc/stat``."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    vals = [int(x) for x in parts]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return (sum(vals[:8]) - idle) / CLK_TCK
