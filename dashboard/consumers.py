"""The WebSocket behind the live pages (dashboard and admin): ``/ws/live/``.

Staff only: for anybody else the socket is closed with code 4403 right after the handshake,
before any data is sent. A connected page first gets a ``snapshot`` (the latest state and the facts/s history),
then an ``update`` for every refresh of this process's :class:`~dashboard.feed.LiveFeed`, and a
``health`` (ok/failing per part, with the reasons) after every readiness check.
"""
from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from dashboard.access import is_staff
from dashboard.feed import LIVE_GROUP, LOCAL_LAYER, live_feed

#: Close code for a refused (not signed in as staff) socket; the page then goes to sign in.
NOT_STAFF = 4403


class LiveConsumer(AsyncJsonWebsocketConsumer):
    channel_layer_alias = LOCAL_LAYER

    async def connect(self) -> None:
        if not is_staff(self.scope.get("user")):
            # Accept only to close with a code the page can read (a refused handshake reaches
            # the browser as 1006): it then goes to sign in instead of retrying forever.
            await self.accept()
            await self.close(code=NOT_STAFF)
            return
        await self.accept()
        self.feed = await live_feed()
        self.feed.join()
        await self.channel_layer.group_add(LIVE_GROUP, self.channel_name)
        await self.send_json({"type": "snapshot", **self.feed.snapshot()})

    async def disconnect(self, code: int) -> None:
        feed = getattr(self, "feed", None)
        if feed is not None:
            feed.leave()
            await self.channel_layer.group_discard(LIVE_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The page has nothing to say; answer a ping so a client can check the socket.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def dashboard_update(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "update", **event["payload"]})

    async def dashboard_health(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "health", **event["payload"]})
