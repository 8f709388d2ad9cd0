"""State that peers create at the endpoint by sending commands, each piece with a cap
(docs/security.md), sans-I/O.

Every byte an endpoint keeps because a peer asked it to must be bounded, per connection and
in all: a peer within the command rate limit can otherwise send a million distinct
``USER_SYNC`` or ``USER_IP`` lines and the endpoint keeps them all (the issue measured 1.5 GB
in 24 s). Sizes are bounded by :mod:`.validation` (user IDs and device IDs of at most 255
bytes, ...), counts here. Past a cap, new entries are dropped, never the connection: a real
worker with more syncing users than the cap keeps being served (the endpoint itself does not
act on presence), and counted in ``dropped`` for operators.
"""
from __future__ import annotations

import collections
from typing import Any

from .commands import UserIpCommand, UserSyncCommand


class SyncingUsersBudget:
    """The endpoint-wide count of (user, device) pairs reported syncing, against ``limit``."""

    __slots__ = ("limit", "used", "dropped")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.dropped = 0


class SyncingUsers:
    """One connection's ``USER_SYNC`` state: ``instance_id -> {(user_id, device_id)}``
    (``by_instance``, the shape ``connections.connection_snapshot`` reads), at most
    ``per_connection`` pairs and at most the budget's in all."""

    def __init__(self, budget: SyncingUsersBudget, per_connection: int,
                 by_instance: dict[str, set[tuple[str, str | None]]] | None = None) -> None:
        self.budget = budget
        self.per_connection = per_connection
        self.by_instance = {} if by_instance is None else by_instance
        self.count = 0
        self.dropped = 0

    def apply(self, cmd: UserSyncCommand) -> bool:
        """Record a start or an end; False if a start was dropped over a cap."""
        key = (cmd.user_id, cmd.device_id)
        users = self.by_instance.get(cmd.instance_id)
        if cmd.is_syncing:
            if users is not None and key in users:
                return True
            if self.count >= self.per_connection or self.budget.used >= self.budget.limit:
                self.dropped += 1
                self.budget.dropped += 1
                return False
            if users is None:
                users = self.by_instance[cmd.instance_id] = set()
            users.add(key)
            self._counted(1)
        elif users is not None and key in users:
            users.discard(key)
            self._counted(-1)
            if not users:
                del self.by_instance[cmd.instance_id]
        return True

    def clear(self, instance_id: str) -> None:
        """CLEAR_USER_SYNC: the instance shut down."""
        users = self.by_instance.pop(instance_id, None)
        if users:
            self._counted(-len(users))

    def release(self) -> None:
        """The connection is gone: its pairs leave the budget."""
        self._counted(-self.count)
        self.by_instance.clear()

    def _counted(self, n: int) -> None:
        self.count += n
        self.budget.used += n


class RecentUserIps:
    """The latest ``USER_IP`` per user, for at most ``limit`` users: the least recently
    reported user is forgotten first. (Nothing else is kept from USER_IP, so it leaves no
    per-connection state.)"""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.entries: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self.evicted = 0

    def add(self, cmd: UserIpCommand) -> None:
        entries = self.entries
        entries[cmd.user_id] = cmd
        entries.move_to_end(cmd.user_id)
        while len(entries) > self.limit:
            entries.popitem(last=False)
            self.evicted += 1

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, user_id: object) -> bool:
        return user_id in self.entries

    def __getitem__(self, user_id: str) -> Any:
        return self.entries[user_id]
