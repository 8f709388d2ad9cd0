"""The inbound command rate limit of one replication connection (docs/security.md), sans-I/O.

A token bucket: ``rate`` commands per second on average, bursts of up to ``burst``. The
caller passes ``now`` (any monotonic clock), so it is tested without sleeping. A worker that
sends more (a flood of PING or USER_SYNC) gets ``ERROR`` and is disconnected by the consumer.
Synapse's workers send a PING every 5 s plus USER_SYNC / USER_IP / FEDERATION_ACK as their
users come and go, which the defaults (1000/s, bursts of 5000) leave plenty of room for.
"""
from __future__ import annotations


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

    def take(self, now: float, n: int = 1) -> bool:
        """Spend ``n`` tokens if there are that many; refills at ``rate`` per second."""
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False
