"""Cache invalidation from the ``caches`` stream: how a worker drops the Django cache
entries a writer invalidated (docs/replication.md, "The worker")."""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Sequence

logger = logging.getLogger(__name__)


class DjangoCacheInvalidator:
    """Applies ``caches`` stream rows ``[cache_func, keys, invalidation_ts]`` to a Django cache.

    Key scheme (writers and readers of cached values must use it, via :meth:`get`,
    :meth:`set` or :meth:`entry_key`):

    * the entry of cached function ``F`` for key components ``(k1, ..., kn)`` lives under the
      Django cache key ``"F:k1:...:kn"``, each component written as text (``%`` and ``:``
      inside it escaped as ``%25`` and ``%3A``, so ``("a:b", "c")`` and ``("a", "b:c")`` never
      collide; non-strings as compact JSON), stored with Django's cache ``version`` set to
      ``F``'s current *generation*;
    * ``F``'s generation lives under ``"F#generation"`` (never expires). It starts at a unique
      value (``time.time_ns()``) when missing and is incremented to drop all of ``F`` at once.

    A row with keys deletes that one entry; a row with ``keys = null`` bumps the generation, so
    every entry written before is never read again (the backend expires or evicts it). If the
    generation key itself is evicted, the next one is a fresh unique value: eviction can only
    lose entries, never revive stale ones. Synapse's "magic" names (``cs_cache_fake`` ...)
    are treated like any other function name here. ``cache=None`` means
    ``django.core.cache.caches["default"]``, looked up on each use (it is per thread).
    """

    def __init__(self, cache: Any = None) -> None:
        self._cache = cache

    @property
    def cache(self) -> Any:
        if self._cache is not None:
            return self._cache
        from django.core.cache import caches

        return caches["default"]

    @staticmethod
    def _component(value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        return text.replace("%", "%25").replace(":", "%3A")

    def entry_key(self, cache_func: str, keys: Sequence[Any]) -> tuple[str, int]:
        """The Django cache key and version of ``cache_func``'s entry for ``keys``."""
        return ":".join([cache_func, *map(self._component, keys)]), self.generation(cache_func)

    def generation(self, cache_func: str) -> int:
        cache, key = self.cache, f"{cache_func}#generation"
        value = cache.get(key)
        if value is None:
            cache.add(key, time.time_ns(), timeout=None)
            value = cache.get(key)
        return int(value)

    def get(self, cache_func: str, keys: Sequence[Any], default: Any = None) -> Any:
        key, version = self.entry_key(cache_func, keys)
        return self.cache.get(key, default, version=version)

    def set(self, cache_func: str, keys: Sequence[Any], value: Any, timeout: Any = None) -> None:
        key, version = self.entry_key(cache_func, keys)
        self.cache.set(key, value, timeout=timeout, version=version)

    def invalidate(self, cache_func: str, keys: Sequence[Any] | None) -> None:
        if keys is None:
            cache, key = self.cache, f"{cache_func}#generation"
            try:
                cache.incr(key)
            except ValueError:  # missing: any fresh value is a new generation
                cache.add(key, time.time_ns(), timeout=None)
            return
        key, version = self.entry_key(cache_func, keys)
        self.cache.delete(key, version=version)

    def apply(self, rows: Sequence[Any]) -> None:
        for row in rows:
            if (not isinstance(row, list) or len(row) != 3 or not isinstance(row[0], str)
                    or not (row[1] is None or isinstance(row[1], list))):
                logger.warning("caches row with an unexpected shape, ignored: %r", row)
                continue
            self.invalidate(row[0], row[1])
