"""Writers tell every endpoint that their position advanced: one small channel-layer message
per batch of advances on the cluster group ``replication.positions``. See
docs/replication.md.

Runs in a thread of its own with its own event loop, because writers are synchronous Django
code; the notifier's callback only records the advance and wakes the thread, so a writer's
commit path never waits for Redis.
"""
from __future__ import annotations

import asyncio
import logging
import threading

from channels.layers import get_channel_layer

from ..notifier import PositionAdvanced, PositionNotifier
from ..registry import get_stream
from .relay import POSITIONS_GROUP

logger = logging.getLogger(__name__)


class PositionPublisher:
    def __init__(self, notifier: PositionNotifier) -> None:
        self._pending: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="position-publisher", daemon=True)
        self._thread.start()
        self._unsubscribe = notifier.subscribe(self._on_advance)
        self._busy = False
        self.published = 0

    def _on_advance(self, advance: PositionAdvanced) -> None:
        token = -advance.new_token if get_stream(advance.stream_name).backwards else advance.new_token
        key = (advance.stream_name, advance.instance_name)
        with self._lock:
            self._pending[key] = max(token, self._pending.get(key, 0))
        self._loop.call_soon_threadsafe(self._wake.set)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._publish_loop())

    async def _publish_loop(self) -> None:
        layer = get_channel_layer()
        while True:
            await self._wake.wait()
            self._wake.clear()
            with self._lock:
                batch, self._pending = self._pending, {}
            if not batch:
                continue
            self._busy = True
            message = {"type": "replication.advances",
                       "advances": [[s, w, t] for (s, w), t in batch.items()]}
            for attempt in range(5):
                try:
                    await layer.group_send(POSITIONS_GROUP, message)
                    self.published += len(batch)
                    break
                except Exception:
                    # Endpoints also poll stream_positions, so a lost message only delays.
                    logger.warning("could not publish position advances (attempt %d)", attempt + 1, exc_info=True)
                    await asyncio.sleep(0.2 * (attempt + 1))
            self._busy = False

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything recorded so far has been published (for clean exits)."""
        done = threading.Event()

        async def probe() -> None:
            while self._pending or self._wake.is_set() or self._busy:
                await asyncio.sleep(0.01)
            done.set()

        asyncio.run_coroutine_threadsafe(probe(), self._loop)
        done.wait(timeout)

    def close(self) -> None:
        self._unsubscribe()
        self.flush()
