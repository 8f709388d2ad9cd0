"""The reads' caches have an owner: the stream runtime (one per process and database)."""
from __future__ import annotations

from rooms.storage.caches import storage_caches
from streams.conf import stream_writers
from streams.runtime import StreamRuntime


def runtime(name: str) -> StreamRuntime:
    return StreamRuntime(instance_name=name, writers=stream_writers("", vendor="postgresql"), using="default")


def test_each_runtime_holds_its_own_caches():
    a, b = runtime("a"), runtime("b")
    assert storage_caches(a) is storage_caches(a) is a.storage_caches
    assert storage_caches(b) is not storage_caches(a)  # two processes' worth: nothing shared


def test_forget_drops_what_was_cached_and_keeps_the_owner():
    rt = runtime("a")
    caches = storage_caches(rt)
    caches.state.remember(7, {("m.room.create", ""): "$c"})
    caches.event_group.put("$e", 7)
    caches.forget()
    assert storage_caches(rt) is caches
    assert caches.event_group.get("$e") is None
    assert caches.state._states.get(7) is None
