"""The inbound command rate limit of one replication connection (docs/security.md), sans-I/O.

A token bucket: ``rate`` commands per second on average, bursts of up to ``burst``. The
caller passes ``now`` (any monotonic clock), so it is tested without sleeping. A worker that
sends more (a flood of PING or USER_SYNC) gets ``ERROR`` and is disconnected by the consumer.
Synapse's workers send a PING every 5 s plus USER_SYNC / USER_IP / FEDERATION_ACK as their
users come and go, which the defaults (1000/s, bursts of 5000) leave plenty of room for.
"""
from __future__ import annotations

from replication.protocol.commands import Command, LegacyReplicateCommand, LockReleasedCommand, RemoteServerUpCommand

#: What a legacy ``REPLICATE <stream> <token>`` costs when received: it asks for a read of the
#: stream's history from ``token`` (the pages it reads are paid for again, see
#: :data:`HISTORY_PAGE_COST`), so a burst of 5000 takes at most 50 of them.
HISTORY_REQUEST_COST = 100
#: What each page of such a read costs (:data:`replication.endpoint.legacy.PAGE_ROWS` rows): the
#: reader waits for the tokens, so a connection reads at most rate / cost pages a second
#: (20 pages, 10,000 rows, with the default 1000/s) and is never disconnected for it.
HISTORY_PAGE_COST = 50
#: Commands the endpoint passes on to every other connection cost one per ten of them.
FAN_OUT_COST = 10


def command_cost(cmd: Command) -> int:
    """The tokens an inbound command takes from its connection's bucket: 1, or more for the
    commands whose work the endpoint multiplies (history reads, commands relayed to everyone)."""
    if isinstance(cmd, LegacyReplicateCommand):
        return 1 if cmd.token == "NOW" else HISTORY_REQUEST_COST
    if isinstance(cmd, (RemoteServerUpCommand, LockReleasedCommand)):
        return FAN_OUT_COST
    return 1


class TokenBucket:
    """``take(now)`` is True while the caller is within ``rate``/s with bursts of ``burst``."""

    __slots__ = ("rate", "burst", "tokens", "updated")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"rate must be > 0 and burst >= 1 (got {rate}, {burst})")
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.updated = now

    def take(self, now: float, n: int = 1, keep: float = 0) -> bool:
        """Spend ``n`` tokens if there are that many (and ``keep`` more, left unspent);
        refills at ``rate`` per second."""
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
        if self.tokens - n >= keep:
            self.tokens -= n
            return True
        return False

    def wait_time(self, now: float, n: int = 1, keep: float = 0) -> float:
        """Seconds until :meth:`take` of ``n`` (keeping ``keep``) can succeed (0: now)."""
        tokens = min(self.burst, self.tokens + max(0.0, now - self.updated) * self.rate)
        return max(0.0, (n + keep - tokens) / self.rate)
