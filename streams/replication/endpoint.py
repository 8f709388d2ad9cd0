"""One replication endpoint process: its relay, its connections, and how it starts.
See docs/replication.md."""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..conf import repl_setting
from .consumer import ConnectionInfo
from .relay import ReplicationRelay

logger = logging.getLogger(__name__)

RECENT_DISCONNECTS = 100


@dataclass
class Endpoint:
    """Shared state of one endpoint process: the relay and who is connected."""

    server_name: str
    relay: ReplicationRelay
    connections: dict[str, ConnectionInfo] = field(default_factory=dict)
    close_reason: dict[str, str] = field(default_factory=dict)
    recent_disconnects: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RECENT_DISCONNECTS))
    user_ips: dict[str, Any] = field(default_factory=dict)
    legacy: Any = None

    def disconnected(self, info: ConnectionInfo, reason: str) -> None:
        self.connections.pop(info.channel_name, None)
        reason = self.close_reason.pop(info.channel_name, reason)
        self.recent_disconnects.append((time.time(), info.name, info.peer, reason))
        logger.info("replication %s (%s) disconnected: %s", info.name, info.peer, reason)

    def user_ip(self, cmd: Any) -> None:
        self.user_ips[cmd.user_id] = cmd



async def start_endpoint(host: str, port: int, *, using: str = "default") -> tuple[Endpoint, asyncio.AbstractServer]:
    """Start the relay and listen. Writes made in this process reach the relay directly."""
    from asgiref.sync import sync_to_async

    from ..runtime import runtime
    from .legacy import LegacyStreamer
    from .tcp import serve

    relay = ReplicationRelay(using=using)
    await relay.start()
    endpoint = Endpoint(server_name=repl_setting("SERVER_NAME"), relay=relay)
    endpoint.legacy = LegacyStreamer(endpoint, using=using)
    loop = asyncio.get_running_loop()
    rt = await sync_to_async(runtime, thread_sensitive=False)()

    def on_advance(advance: Any) -> None:
        from ..registry import get_stream

        token = -advance.new_token if get_stream(advance.stream_name).backwards else advance.new_token
        loop.call_soon_threadsafe(relay.advanced, advance.stream_name, advance.instance_name, token)

    rt.notifier.subscribe(on_advance)
    server = await serve(endpoint, host, port)
    return endpoint, server
