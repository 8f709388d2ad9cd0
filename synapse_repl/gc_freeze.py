"""Everything a serving process loaded at start-up, out of the garbage collector's way.

Django, the apps, psycopg and the routing leave ~130,000 objects (modules, functions, types)
that live as long as the process. Each full collection walks them all, and on this machine
that takes 40-70 ms (measured: gen-2 pauses of 50-69 ms while incremental syncs ran, which
made their p99; docs/benchmarks.md). A full collection can never free them, so
they are moved to the permanent generation once, when start-up is over
(:func:`gc.freeze`): a collection then walks only what requests and caches made since.
"""
from __future__ import annotations

import gc


def freeze_long_lived() -> int:
    """Collect what start-up left unreachable, then freeze the rest; returns how many objects
    were frozen. Call it once, after the last import and set-up of a serving process."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
