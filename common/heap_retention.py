"""Keep freed heap memory for reuse instead of handing it back to the kernel (glibc only).

A process that receives and sends buffers of hundreds of KiB (the replication endpoint: one
writer's batch of lines is ~340 KiB) allocates and frees one or more of them per message.
glibc's malloc serves such sizes with ``mmap`` or returns the top of its heap to the kernel
once more than twice the last such size is free there, so each new buffer's pages are
faulted in and zeroed by the kernel again: in ``benchmarks/bench_replication.py`` about 100
page faults per batch, which cost the endpoint more CPU than everything else it does per
batch. With a higher ``mmap`` threshold and trim threshold, freed buffers are reused as they
are: the process keeps at most ``trim_threshold`` bytes of free heap it would otherwise have
returned.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

#: glibc's ``mallopt`` parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Allocations up to this size come from the heap (glibc's own dynamic threshold stops at
#: the largest block freed so far; setting either parameter turns that adjustment off).
MMAP_THRESHOLD = 8 << 20
#: Free memory at the heap's top kept rather than returned to the kernel.
TRIM_THRESHOLD = 32 << 20


def retain_freed_heap(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Raise this process's malloc thresholds; False where the C library is not glibc (or
    refuses), which changes nothing but the CPU spent on page faults."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        # glibc only: gnu_get_libc_version exists there and nowhere else (musl has mallopt
        # as a stub that ignores its arguments).
        if not hasattr(libc, "gnu_get_libc_version"):
            return False
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    if not ok:
        logger.debug("mallopt refused the heap thresholds")
    return ok
