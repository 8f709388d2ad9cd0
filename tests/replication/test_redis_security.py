"""REDIS_URL with a password (and rediss://) reaches every Redis client we create: the
channel layer, the Synapse Redis bridge, the Redis worker and Celery."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from replication.protocol.commands import RdataCommand, parse_line
from replication.protocol.line_batch import encode_run
from tests.replication.endpoint.test_endpoint import SERVER_NAME, handshake
from tests.replication.endpoint.test_limits import running_endpoint, self_signed

ROOT = Path(__file__).resolve().parents[2]


def test_server_really_requires_the_password(redis_server_with_password):
    without = redis_server_with_password.url.replace(f":{redis_server_with_password.password}@", "")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(without).ping()
    assert redis.Redis.from_url(redis_server_with_password.url).ping()


@pytest.mark.django_db(transaction=True)
def test_endpoint_writer_and_bridge_with_a_password(pg_url, tmp_path, redis_server_with_password):
    url = redis_server_with_password.url
    # No position polling within the test: RDATA can only come through the channel layer.
    with running_endpoint(pg_url, tmp_path / "endpoint.log", REDIS_URL=url, POSITION_POLL_SECONDS="600",
                          STREAM_WRITERS="receipts=master") as (port, read_log):
        client = handshake(port)
        client.read_until(lambda line: line.startswith("POSITION to_device"))
        env = dict(os.environ, DATABASE_URL=pg_url, REDIS_URL=url, SERVER_NAME=SERVER_NAME,
                   STREAM_WRITERS="receipts=master")
        subprocess.run([sys.executable, "manage.py", "write_facts", "receipts", "--count", "20",
                        "--no-progress"], cwd=ROOT, env=env, check=True, capture_output=True, timeout=120)
        # Through the channel layer (Redis pub/sub, with the password) to the endpoint: RDATA.
        tokens = set()
        while len(tokens) < 20:
            cmd = parse_line(client.read_line(timeout=30))
            if isinstance(cmd, RdataCommand) and cmd.stream_name == "receipts":
                tokens.add(cmd.token)
        client.close()
        assert "AUTH" not in read_log() and "Authentication" not in read_log()


def test_synapse_channel_bridge_with_a_password(redis_server_with_password):
    """The bridge (writers' and endpoints' Synapse-channel publisher) authenticates for its
    subscription and its PUBLISHes."""
    import asyncio

    from replication.publish.redis_bridge import SynapseRedisBridge

    url, channel = redis_server_with_password.url, "pw.example"
    subscriber = redis.Redis.from_url(url).pubsub()
    subscriber.subscribe(channel)
    assert subscriber.get_message(timeout=10)["type"] == "subscribe"

    async def publish() -> None:
        bridge = SynapseRedisBridge(url, channel, announce=lambda: [])
        bridge.start()
        try:
            await asyncio.wait_for(bridge.subscribed.wait(), 60)
            await bridge.publish_run(encode_run("receipts", "master", 0, 1, [(1, [["x"]])])[0])
        finally:
            await bridge.stop()

    asyncio.run(publish())
    published = []
    while (message := subscriber.get_message(timeout=5)) is not None:
        if message["type"] == "message":
            published.append(message["data"].decode())
    assert 'RDATA receipts master 1 ["x"]' in published


def _celery_ping(redis_url: str) -> subprocess.CompletedProcess:
    code = ("import django, os; os.environ['DJANGO_SETTINGS_MODULE']='synapse_repl.settings'; "
            "django.setup(); from jobs.celery_app import app; "
            "conn = app.connection_for_write(); conn.ensure_connection(max_retries=1); "
            "conn.default_channel.client.ping(); print('ok')")
    env = {"PATH": os.environ["PATH"], "REDIS_URL": redis_url,
           "STATE_DIR": os.environ.get("STATE_DIR", str(ROOT / "var"))}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_celery_broker_with_a_password(redis_server_with_password):
    url = redis_server_with_password.url
    assert _celery_ping(url).stdout.strip() == "ok"
    wrong = _celery_ping(url.replace(redis_server_with_password.password, "wrong"))
    assert wrong.returncode != 0 and "ok" not in wrong.stdout


def test_rediss_is_verified_by_every_client(tmp_path):
    """A TLS-only Redis: redis-py (layer, bridge, worker) and Celery connect with the CA given
    in the URL, and refuse the server without it."""
    from synapse_repl.security import celery_redis_ssl
    from testing.services import RedisServer

    cert, key = self_signed(tmp_path, "redis")
    server = RedisServer(password="pw", tls_cert=str(cert), tls_key=str(key))
    try:
        server.start()
    except Exception as e:  # noqa: BLE001 - a redis-server built without TLS
        pytest.fail(f"redis-server could not serve TLS: {e}")
    try:
        assert server.url.startswith("rediss://")
        assert redis.Redis.from_url(server.url).ping()
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            redis.Redis.from_url(server.url.split("?")[0]).ping()  # system CAs: untrusted
        assert celery_redis_ssl(server.url)["ssl_ca_certs"] == str(cert)
        assert _celery_ping(server.url).stdout.strip() == "ok"
        assert _celery_ping(server.url.split("?")[0]).returncode != 0
    finally:
        server.stop()
