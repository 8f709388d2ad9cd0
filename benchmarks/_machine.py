"""What every benchmark prints about the machine it ran on."""
from __future__ import annotations

import os


def cpu_description() -> str:
    """``"2 cores (2 usable) <CPU model>"``."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return f"{os.cpu_count()} cores ({usable} usable) {model}"
