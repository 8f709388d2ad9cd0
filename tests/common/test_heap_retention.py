"""retain_freed_heap: buffers of a batch's size are reused, not faulted in afresh each time."""
from __future__ import annotations

import subprocess
import sys

# Allocates and frees buffers the size of a writer's batch the way the endpoint's receive path
# does (a received chunk, the joined payload, the decoded data), and prints the minor page
# faults of the loop.
_SCRIPT = """
import resource, sys
from common.heap_retention import retain_freed_heap
if sys.argv[1] == "retain":
    assert retain_freed_heap()
chunk = b"x" * 250_000
for _ in range(20):  # let glibc settle its own thresholds first
    bytes(b"".join([chunk, chunk[:90_000]]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(300):
    a = bytes(bytearray(chunk))
    b = b"".join([a, chunk[:90_000]])
    c = bytes(memoryview(b)[100:])
    del a, b, c
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, check=True)
    return int(out.stdout)


def test_batch_sized_buffers_are_reused_without_page_faults():
    default, retained = _faults("default"), _faults("retain")
    # 300 rounds of ~1 MB of fresh buffers: glibc's defaults fault pages in again and again
    assert default > 300, default
    assert retained < default / 10, (retained, default)
