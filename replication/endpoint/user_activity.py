"""What an endpoint does with the client activity its workers report (docs/replication.md).

* ``USER_IP``: into the ``user_ips`` table (:class:`~replication.models.UserIp`), keyed as
  Synapse keys it: (user, access token, address). Commands are coalesced in memory per key
  (:class:`UserIpBatch`, pure, bounded) and written in one upsert per interval
  (:class:`UserIpRecorder`), as Synapse's main process batches its client-IP updates: a
  worker reports every request, and one write per command would cost the database more
  than the commands are worth.
* ``USER_SYNC`` / ``CLEAR_USER_SYNC``: which syncing processes (a worker's random
  ``instance_id``) report a user as syncing, per connection (:class:`SyncingUsers`, pure,
  bounded); dropped on ``CLEAR_USER_SYNC`` and when the connection goes. The dashboard
  shows it per user (``/connections/users/``).

Bounds: the table is the store for IPs; what is held in memory is capped (pending IP keys
per endpoint, in number and in bytes; syncs per connection and per endpoint). Beyond a cap,
new entries are refused and counted, never queued. Pending IPs are written
:data:`USER_IP_WRITE_CHUNK` rows a statement, so a write holds the rows of one statement
at a time besides the batch it writes.
"""
from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable

from replication.models import MAX_ACCESS_TOKEN, MAX_DEVICE_ID, MAX_IP, MAX_USER_AGENT, MAX_USER_ID, UserIp

logger = logging.getLogger(__name__)

#: Distinct (user, token, address) keys waiting for the next write; beyond it new keys are
#: refused until the write (known keys still update in place).
MAX_PENDING_USER_IPS = 50_000
#: And the bytes they may hold (Python's own size of their strings, plus the entry): fields
#: at their largest are 2 KB a key in ASCII, 6 KB in 4-byte characters, so the number alone
#: let a flood of long non-ASCII fields hold 59 MiB in 10,000 keys (and as much again while
#: the previous batch was written).
MAX_PENDING_USER_IP_BYTES = 8 * 1024 * 1024
#: What a pending key costs beyond its strings: the dict slot, the key and value tuples, the int.
USER_IP_ENTRY_OVERHEAD = 200
#: Rows per upsert statement when a batch is written (one transaction).
USER_IP_WRITE_CHUNK = 1_000
#: Synapse's main process writes its client-IP batch every 5 s.
USER_IP_FLUSH_SECONDS = 5.0

#: (user, device) pairs reported syncing on one connection, over all its instance IDs.
MAX_SYNCS_PER_CONNECTION = 10_000
#: Syncing-process instance IDs on one connection (one per worker run; a few expected).
MAX_INSTANCES_PER_CONNECTION = 64
#: (user, device) pairs on all connections of one endpoint.
MAX_SYNCS_TOTAL = 200_000

UserIpKey = tuple[str, str, str]  # (user_id, access_token, ip)
#: ``last_seen`` must fit the column (BIGINT): one value beyond it would fail the whole batch.
MAX_LAST_SEEN = 2**63 - 1


def user_ip_problem(cmd: Any) -> str | None:
    """Why ``cmd`` (a ``UserIpCommand``) cannot be stored, or None."""
    if not cmd.user_id or len(cmd.user_id) > MAX_USER_ID:
        return f"user ID longer than {MAX_USER_ID} characters (or empty)"
    if type(cmd.access_token) is not str or len(cmd.access_token) > MAX_ACCESS_TOKEN:
        return f"access token not a string of at most {MAX_ACCESS_TOKEN} characters"
    if type(cmd.ip) is not str or not cmd.ip or len(cmd.ip) > MAX_IP:
        return f"address not a string of 1 to {MAX_IP} characters"
    if type(cmd.user_agent) is not str:
        return "user agent not a string"
    if not 0 <= cmd.last_seen <= MAX_LAST_SEEN:
        return "last_seen out of range (a BIGINT of milliseconds)"
    if cmd.device_id is not None and len(cmd.device_id) > MAX_DEVICE_ID:
        return f"device ID longer than {MAX_DEVICE_ID} characters"
    text = cmd.user_id + cmd.access_token + cmd.ip + cmd.user_agent + (cmd.device_id or "")
    if "\x00" in text:
        return "NUL character"
    try:
        text.encode("utf-8")  # a lone surrogate (JSON "\ud800") would fail the whole batch
    except UnicodeEncodeError:
        return "not valid Unicode"
    return None


def _showable(value: str) -> bool:
    """At most 255 printable characters (no NUL: PostgreSQL's jsonb refuses it)."""
    return 0 < len(value) <= MAX_USER_ID and value.isprintable()


def _entry_bytes(key: UserIpKey, value: tuple[str, str | None, int]) -> int:
    user_agent, device_id = value[0], value[1]
    return (sum(sys.getsizeof(part) for part in key) + sys.getsizeof(user_agent)
            + (sys.getsizeof(device_id) if device_id is not None else 0) + USER_IP_ENTRY_OVERHEAD)


class UserIpBatch:
    """USER_IP commands not yet written, one entry per Synapse key; the latest sighting wins.
    At most ``max_pending`` keys and ``max_bytes`` of them (:func:`_entry_bytes`)."""

    def __init__(self, max_pending: int = MAX_PENDING_USER_IPS,
                 max_bytes: int = MAX_PENDING_USER_IP_BYTES) -> None:
        self.max_pending = max_pending
        self.max_bytes = max_bytes
        self._pending: dict[UserIpKey, tuple[str, str | None, int]] = {}
        self.size_bytes = 0
        self.refused = 0

    def add(self, cmd: Any) -> bool:
        """Take one command; False (and counted) if it is malformed or the batch is full."""
        if user_ip_problem(cmd) is not None:
            self.refused += 1
            return False
        key = (cmd.user_id, cmd.access_token, cmd.ip)
        known = self._pending.get(key)
        value = (cmd.user_agent[:MAX_USER_AGENT], cmd.device_id, cmd.last_seen)
        if known is None:
            cost = _entry_bytes(key, value)
            if len(self._pending) >= self.max_pending or self.size_bytes + cost > self.max_bytes:
                self.refused += 1
                return False
            self._pending[key] = value
            self.size_bytes += cost
        elif cmd.last_seen >= known[2]:
            # a known key: its user agent and device may change size (each at most 512/255)
            self.size_bytes += _entry_bytes(key, value) - _entry_bytes(key, known)
            self._pending[key] = value
        return True

    def take(self) -> list[tuple[str, str, str, str, str | None, int]]:
        """Everything pending as ``(user_id, access_token, ip, user_agent, device_id,
        last_seen)`` rows, sorted by key (concurrent writers lock rows in one order); empty after."""
        pending, self._pending, self.size_bytes = self._pending, {}, 0
        return [(*key, *value) for key, value in sorted(pending.items())]

    def __len__(self) -> int:
        return len(self._pending)


def write_user_ips(rows: Iterable[tuple[str, str, str, str, str | None, int]], using: str = "default",
                   chunk: int = USER_IP_WRITE_CHUNK) -> int:
    """Upsert ``rows`` into ``user_ips`` (one transaction, ``chunk`` rows a statement: the
    model objects and parameters of one statement at a time); a row already there keeps the
    newer ``last_seen`` and its user agent and device. Returns the number of rows written."""
    from django.db import connections, transaction

    rows = list(rows)
    if not rows:
        return 0
    try:
        with transaction.atomic(using=using):
            for start in range(0, len(rows), chunk):
                UserIp.objects.using(using).bulk_create(
                    [UserIp(user_id=u, access_token=t, ip=ip, user_agent=ua, device_id=d, last_seen=seen)
                     for u, t, ip, ua, d, seen in rows[start:start + chunk]],
                    update_conflicts=True, unique_fields=["user_id", "access_token", "ip"],
                    update_fields=["user_agent", "device_id", "last_seen"],
                )
    finally:
        connections[using].close()  # a pool thread may not come back to it
    return len(rows)


class UserIpRecorder:
    """An endpoint's USER_IP path: commands into a :class:`UserIpBatch`, the batch into the
    table every ``interval`` seconds (and on :meth:`stop`)."""

    def __init__(self, *, interval: float = USER_IP_FLUSH_SECONDS, using: str = "default",
                 max_pending: int = MAX_PENDING_USER_IPS) -> None:
        self.interval = interval
        self.using = using
        self.batch = UserIpBatch(max_pending)
        self.received = 0
        self.written = 0
        self.in_flight = 0
        self.writes = 0
        self._task: asyncio.Task[None] | None = None

    def record(self, cmd: Any) -> bool:
        self.received += 1
        return self.batch.add(cmd)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._flush_forever(), name="user-ip-recorder")

    async def flush(self) -> int:
        from asgiref.sync import sync_to_async

        rows = self.batch.take()
        if not rows:
            return 0
        # still pending while they are written: a status taken meanwhile must not show them
        # neither pending nor written
        self.in_flight = len(rows)
        try:
            written: int = await sync_to_async(write_user_ips, thread_sensitive=False)(rows, self.using)
        except Exception:
            # Sightings are refreshed by the next request of the same client: log, move on.
            logger.exception("could not write %d user_ips row(s)", len(rows))
            return 0
        finally:
            self.in_flight = 0
        self.written += written
        self.writes += 1
        return written

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.flush()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()

    def counters(self) -> dict[str, int]:
        return {"received": self.received, "written": self.written, "writes": self.writes,
                "refused": self.batch.refused, "pending": len(self.batch) + self.in_flight}


@dataclass
class SyncingUsers:
    """USER_SYNC state of one endpoint: per connection, per syncing-process instance ID, the
    (user, device) pairs reported syncing with their last sync time (ms)."""

    max_per_connection: int = MAX_SYNCS_PER_CONNECTION
    max_instances: int = MAX_INSTANCES_PER_CONNECTION
    max_total: int = MAX_SYNCS_TOTAL
    #: connection -> instance_id -> {(user_id, device_id): last_sync_ms}
    by_connection: dict[str, dict[str, dict[tuple[str, str | None], int]]] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)
    total: int = 0
    refused: int = 0

    def user_sync(self, connection: str, cmd: Any) -> bool:
        """Apply one USER_SYNC; False (and counted) when a cap refuses a new entry, or its
        IDs could not be shown (they end up in the endpoint's snapshot, a JSON column)."""
        if not all(_showable(v) for v in (cmd.instance_id, cmd.user_id, cmd.device_id or "-")):
            self.refused += 1
            return False
        instances = self.by_connection.setdefault(connection, {})
        pair = (cmd.user_id, cmd.device_id)
        if not cmd.is_syncing:
            users = instances.get(cmd.instance_id)
            if users is not None and users.pop(pair, None) is not None:
                self._count(connection, -1)
                if not users:
                    del instances[cmd.instance_id]
            if not instances:
                del self.by_connection[connection]
            return True
        users = instances.get(cmd.instance_id)
        if users is not None and pair in users:
            users[pair] = cmd.last_sync_ms
            return True
        if ((users is None and len(instances) >= self.max_instances)
                or self._counts.get(connection, 0) >= self.max_per_connection
                or self.total >= self.max_total):
            self.refused += 1
            if not instances:
                del self.by_connection[connection]
            return False
        instances.setdefault(cmd.instance_id, {})[pair] = cmd.last_sync_ms
        self._count(connection, 1)
        return True

    def clear_instance(self, connection: str, instance_id: str) -> None:
        """CLEAR_USER_SYNC: that syncing process is shutting down."""
        instances = self.by_connection.get(connection, {})
        users = instances.pop(instance_id, None)
        if users:
            self._count(connection, -len(users))
        if not instances:
            self.by_connection.pop(connection, None)

    def connection_lost(self, connection: str) -> None:
        for instance_id in list(self.by_connection.get(connection, {})):
            self.clear_instance(connection, instance_id)
        self._counts.pop(connection, None)

    def _count(self, connection: str, delta: int) -> None:
        self._counts[connection] = self._counts.get(connection, 0) + delta
        self.total += delta
        if not self._counts[connection]:
            del self._counts[connection]

    def of_connection(self, connection: str, limit: int) -> list[dict[str, Any]]:
        """A connection's syncs for operators: ``{user_id, device_id, instance_id,
        last_sync_ms}``, sorted, at most ``limit``."""
        entries = [
            {"user_id": user, "device_id": device, "instance_id": instance_id, "last_sync_ms": ms}
            for instance_id, users in self.by_connection.get(connection, {}).items()
            for (user, device), ms in users.items()
        ]
        entries.sort(key=lambda e: (e["user_id"], e["instance_id"], e["device_id"] or ""))
        return entries[:limit]

    def users_of_connection(self, connection: str) -> set[str]:
        return {user for users in self.by_connection.get(connection, {}).values() for user, _ in users}


def syncing_by_user(endpoints: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """From endpoint snapshots (the dashboard's ``endpoint_statuses()``): per user, every
    report of it syncing: which endpoint, connection (worker NAME) and syncing-process
    instance ID, which device, since when. Stale endpoints are left out (their workers'
    reports are not current)."""
    result: dict[str, list[dict[str, Any]]] = {}
    for endpoint in endpoints:
        if endpoint.get("stale"):
            continue
        for conn in endpoint.get("connections", ()):
            for entry in conn.get("syncing", ()):
                result.setdefault(entry["user_id"], []).append({
                    "endpoint": endpoint["endpoint"], "connection": conn["name"], "peer": conn["peer"],
                    "instance_id": entry["instance_id"], "device_id": entry["device_id"],
                    "last_sync_ms": entry["last_sync_ms"],
                })
    return dict(sorted(result.items()))
