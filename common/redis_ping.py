"""One PING to a Redis, bounded: the start-up checks and the readiness probe share it."""
from __future__ import annotations


def ping_redis(url: str, timeout: float) -> None:
    """One PING to the Redis at ``url``, within ``timeout``; raises what redis-py raises."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    finally:
        client.close()
