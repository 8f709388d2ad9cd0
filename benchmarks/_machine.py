"""What every benchmark prints about the machine it ran on."""
from __future__ import annotations

import os


def cpu_description() -> str:
    """``"2 cores (2 usable) <CPU model>"``."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return f"{os.cpu_count()} cores ({usable} usable) {model}"


def load_average() -> str:
    """The 1/5/15-minute load averages, as the benchmarks print them."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def server_versions(pg_url: str, redis_url: str) -> dict[str, str]:
    """PostgreSQL's version and fsync setting, Redis's version, and whether redis-py has hiredis."""
    import psycopg
    import redis

    with psycopg.connect(pg_url, autocommit=True) as conn:
        postgres = conn.execute("SELECT version()").fetchone()[0].split(",")[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
    r = redis.Redis.from_url(redis_url)
    redis_version = r.info("server")["redis_version"]
    r.close()
    try:
        import hiredis  # noqa: F401

        hi = "with hiredis"
    except ImportError:
        hi = "no hiredis"
    return {"postgres": postgres, "fsync": fsync, "redis": redis_version, "hiredis": hi}
