"""What endpoints do with USER_IP, USER_SYNC/CLEAR_USER_SYNC, REMOTE_SERVER_UP and
LOCK_RELEASED (replication/endpoint/user_activity.py, broadcast.py): the pure bookkeeping,
the user_ips upsert on both databases, and two real endpoint processes on Redis."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
import redis

from replication.endpoint.user_activity import (
    SyncingUsers,
    UserIpBatch,
    UserIpRecorder,
    syncing_by_user,
    write_user_ips,
)
from replication.models import UserIp
from replication.protocol.commands import ClearUserSyncCommand, UserIpCommand, UserSyncCommand, parse_line
from testing.processes import stop_process, wait_port
from testing.services import free_port
from tests.replication.endpoint.test_endpoint import ROOT, SERVER_NAME, LineClient

WAIT = 30


def user_ip(user="@u:hs", token="tok", ip="1.2.3.4", ua="UA", device="DEV", seen=1000) -> UserIpCommand:
    return parse_line(f'USER_IP {user} ["{token}","{ip}","{ua}",' + (f'"{device}"' if device else "null") + f",{seen}]")


def sync(instance="inst", user="@u:hs", device="DEV", start=True, ms=1) -> UserSyncCommand:
    return UserSyncCommand(instance, user, device, start, ms)


# -- pure bookkeeping ------------------------------------------------------------------------

def test_user_ip_batch_keeps_the_latest_sighting_per_synapse_key():
    batch = UserIpBatch()
    batch.add(user_ip(seen=5, ua="new"))
    batch.add(user_ip(seen=3, ua="old"))  # older: loses
    batch.add(user_ip(ip="5.6.7.8", seen=1))  # another address: another row
    batch.add(user_ip(token="tok2", seen=2, device=None))
    assert batch.take() == [
        ("@u:hs", "tok", "1.2.3.4", "new", "DEV", 5),
        ("@u:hs", "tok", "5.6.7.8", "UA", "DEV", 1),
        ("@u:hs", "tok2", "1.2.3.4", "UA", None, 2),
    ]
    assert batch.take() == []


def test_user_ip_batch_is_bounded_and_refuses_what_cannot_be_stored():
    batch = UserIpBatch(max_pending=2)
    assert batch.add(user_ip(ip="1.1.1.1"))
    assert batch.add(user_ip(ip="2.2.2.2"))
    assert not batch.add(user_ip(ip="3.3.3.3"))  # full: a new key is refused
    assert batch.add(user_ip(ip="1.1.1.1", seen=9))  # a known key still updates
    assert not batch.add(user_ip(user="@" + "x" * 300 + ":hs"))
    assert not batch.add(user_ip(ip="9" * 100))
    assert not batch.add(user_ip(ip="1.1.1.1", seen=2**63))  # beyond BIGINT: would fail the whole write
    assert not batch.add(user_ip(ip="1.1.1.1", seen=-1))
    assert not batch.add(user_ip(ip="1.1.1.1", ua="\\ud800"))  # a lone surrogate: PostgreSQL refuses it
    assert batch.refused == 6 and len(batch) == 2
    long_agent = UserIpBatch()
    long_agent.add(user_ip(ua="A" * 5000))
    assert len(long_agent.take()[0][3]) == 512


def test_user_ip_batch_is_bounded_in_bytes_as_python_holds_them():
    """A flood of long non-ASCII fields (4 bytes a character in a str) fills the byte budget
    long before the key count; what the batch counts is what it holds (tracemalloc)."""
    import json
    import tracemalloc

    wide = "\U0001F600"
    lines = [f"USER_IP @u{i}:hs " + json.dumps([wide * 500, wide * 60, wide * 512, wide * 255, 1000])
             for i in range(400)]
    batch = UserIpBatch(max_pending=10_000, max_bytes=1024 * 1024)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    taken = [batch.add(parse_line(line)) for line in lines]  # each field a string of its own
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    kept = taken.count(True)
    assert 0 < kept < 400 and taken == [True] * kept + [False] * (400 - kept)
    assert batch.refused == 400 - kept
    assert 1024 * 1024 - 7_000 < batch.size_bytes <= 1024 * 1024
    assert abs(held - batch.size_bytes) < batch.size_bytes * 0.05, (held, batch.size_bytes)
    # a known key still updates (its size follows); take() empties the count with the batch
    before_update = batch.size_bytes
    assert batch.add(user_ip(user="@u0:hs", token=wide * 500, ip=wide * 60, ua="short", device=None, seen=2000))
    assert batch.size_bytes < before_update
    assert len(batch.take()) == kept and batch.size_bytes == 0
    assert batch.add(parse_line(lines[-1]))


def test_syncing_users_start_end_clear_and_connection_loss():
    s = SyncingUsers()
    s.user_sync("c1", sync("i1", "@a:hs", "D1"))
    s.user_sync("c1", sync("i1", "@b:hs", None))
    s.user_sync("c1", sync("i2", "@a:hs", "D2"))
    s.user_sync("c2", sync("j1", "@a:hs", "D3"))
    assert s.total == 4 and s.users_of_connection("c1") == {"@a:hs", "@b:hs"}
    s.user_sync("c1", sync("i1", "@b:hs", None, start=False))
    assert s.users_of_connection("c1") == {"@a:hs"} and s.total == 3
    s.clear_instance("c1", "i2")
    assert [e["instance_id"] for e in s.of_connection("c1", 10)] == ["i1"]
    s.connection_lost("c1")
    assert s.of_connection("c1", 10) == [] and "c1" not in s.by_connection and s.total == 1
    assert [(e["user_id"], e["instance_id"]) for e in s.of_connection("c2", 10)] == [("@a:hs", "j1")]


def test_syncing_users_caps():
    s = SyncingUsers(max_per_connection=3, max_instances=2, max_total=5)
    assert all(s.user_sync("c1", sync("i1", f"@u{n}:hs")) for n in range(3))
    assert not s.user_sync("c1", sync("i1", "@u3:hs"))  # per-connection cap
    assert s.user_sync("c1", sync("i1", "@u0:hs", ms=7))  # a known pair is refreshed
    assert s.user_sync("c2", sync("j1", "@v:hs")) and s.user_sync("c2", sync("j2", "@v:hs"))
    assert not s.user_sync("c2", sync("j3", "@v:hs"))  # instance IDs per connection
    assert not s.user_sync("c3", sync("k1", "@w:hs"))  # endpoint total (5)
    assert s.refused == 3 and s.total == 5 and "c3" not in s.by_connection
    ids = SyncingUsers()
    assert not ids.user_sync("c1", sync("i1", "@nul\x00:hs")) and not ids.user_sync("c1", sync("i1", "@" + "x" * 300))
    assert ids.refused == 2 and ids.total == 0 and ids.by_connection == {}


def test_syncing_by_user_skips_stale_endpoints():
    entry = {"user_id": "@a:hs", "device_id": "D", "instance_id": "i1", "last_sync_ms": 5}
    conn = {"name": "w1", "peer": "127.0.0.1:1", "syncing": [entry]}
    result = syncing_by_user([
        {"endpoint": "e1", "stale": False, "connections": [conn]},
        {"endpoint": "e2", "stale": True, "connections": [conn]},
    ])
    assert result == {"@a:hs": [{"endpoint": "e1", "connection": "w1", "peer": "127.0.0.1:1",
                                 "instance_id": "i1", "device_id": "D", "last_sync_ms": 5}]}


# -- the table --------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_user_ips_upsert_keyed_as_synapse(default_database):
    write_user_ips([("@u:hs", "tok", "1.2.3.4", "UA1", "D1", 10), ("@u:hs", "tok", "5.6.7.8", "UA1", "D1", 11)])
    write_user_ips([("@u:hs", "tok", "1.2.3.4", "UA2", "D2", 20)])
    rows = sorted(UserIp.objects.values_list("user_id", "access_token", "ip", "user_agent", "device_id", "last_seen"))
    assert rows == [("@u:hs", "tok", "1.2.3.4", "UA2", "D2", 20), ("@u:hs", "tok", "5.6.7.8", "UA1", "D1", 11)]


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
def test_user_ips_are_written_a_chunk_a_statement(default_database):
    rows = [(f"@u{i}:hs", "tok", "1.2.3.4", "UA", None, i) for i in range(7)]
    assert write_user_ips(rows, chunk=3) == 7
    assert sorted(UserIp.objects.values_list("user_id", "last_seen")) == sorted((r[0], r[5]) for r in rows)


@pytest.mark.django_db(transaction=True)
def test_recorder_writes_many_commands_in_one_batch():
    async def run() -> UserIpRecorder:
        recorder = UserIpRecorder(interval=3600)
        recorder.start()
        for n in range(500):
            recorder.record(user_ip(user=f"@u{n % 50}:hs", seen=n))
        await recorder.stop()  # writes what is pending
        return recorder

    recorder = asyncio.run(run())
    assert recorder.counters() == {"received": 500, "written": 50, "writes": 1, "refused": 0, "pending": 0}
    assert UserIp.objects.count() == 50
    assert UserIp.objects.get(user_id="@u7:hs").last_seen == 457  # the last of its 10 sightings


# -- two endpoints on Redis -------------------------------------------------------------------

class Ports(list):
    """The endpoints' ports; ``procs``: their processes, in the same order."""

    procs: list


@pytest.fixture
def two_endpoints(pg_url, tmp_path, redis_server):
    procs, ports = [], Ports()
    ports.procs = procs
    try:  # an endpoint that did not start must not leave the other running
        for n in range(2):
            port = free_port()
            log_path = tmp_path / f"endpoint{n}.log"
            env = dict(os.environ, DATABASE_URL=pg_url, SERVER_NAME=SERVER_NAME, REDIS_URL=redis_server.url,
                       PYTHONUNBUFFERED="1", USER_IP_FLUSH_SECONDS="0.2", USER_IP_LEASE_SECONDS="3")
            proc = subprocess.Popen([sys.executable, "manage.py", "runreplication", "--listen", f"127.0.0.1:{port}"],
                                    cwd=ROOT, env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
            procs.append(proc)
            wait_port(port, proc, log_path)
            ports.append(port)
        yield ports
    finally:
        for proc in procs:
            stop_process(proc)


def worker(port: int, name: str) -> LineClient:
    c = LineClient(port)
    assert c.read_line() == f"SERVER {SERVER_NAME}"
    c.send(f"NAME {name}", "REPLICATE ")
    c.read_until(lambda line: line.startswith("POSITION to_device"))
    return c


def wait_until(predicate, what: str):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"never happened: {what}")


def commands_of(c: LineClient, count: int, seconds: float = 10.0) -> list[str]:
    """The first ``count`` lines ``c`` receives other than PING and POSITION, or all that
    came within ``seconds`` (the endpoint PINGs every 5 s: a plain read_until never ends)."""
    got, deadline = [], time.monotonic() + seconds
    while len(got) < count and (remaining := deadline - time.monotonic()) > 0:
        try:
            line = c.read_line(remaining)
        except TimeoutError:
            break
        if line is None:
            break
        if not line.startswith(("PING", "POSITION")):
            got.append(line)
    return got


def lines_of(c: LineClient, seconds: float) -> list[str]:
    """Every line ``c`` receives within ``seconds`` (PINGs left out)."""
    lines, deadline = [], time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            line = c.read_line(remaining)
        except TimeoutError:
            break
        if line is None:
            break
        if not line.startswith("PING"):
            lines.append(line)
    return lines


@pytest.mark.django_db(transaction=True)
def test_remote_server_up_and_lock_released_reach_every_worker(two_endpoints, redis_server):
    a_port, b_port = two_endpoints
    subscriber = redis.Redis.from_url(redis_server.url).pubsub()
    subscriber.subscribe(SERVER_NAME)
    sender, same_endpoint, other_endpoint = worker(a_port, "sender"), worker(a_port, "w-a"), worker(b_port, "w-b")
    commands = ["REMOTE_SERVER_UP matrix.example", 'LOCK_RELEASED ["sender","purge","!room:hs"]']
    sender.send(*commands)
    for c in (same_endpoint, other_endpoint):
        assert commands_of(c, len(commands)) == commands
    heard = []
    deadline = time.monotonic() + WAIT
    while len(heard) < 2 and time.monotonic() < deadline:
        message = subscriber.get_message(timeout=1)
        if message and message["type"] == "message" and not message["data"].startswith((b"POSITION", b"REPLICATE")):
            heard.append(message["data"].decode())
    assert heard == commands  # Redis subscribers (Redis workers, Synapse's processes) too
    # Not echoed to the sender, and once only to each of the others: the sender's endpoint
    # hears its own publication back on Redis and drops it; the other endpoint hears it
    # there only (not also through the channel layer).
    assert [line for line in lines_of(sender, 1.0) if not line.startswith("POSITION")] == []
    for c in (same_endpoint, other_endpoint):
        assert [line for line in lines_of(c, 0.5) if not line.startswith("POSITION")] == []
    a, b = cluster_commands(a_port), cluster_commands(b_port)
    assert (a["from_workers"], a["own_echoes"], a["from_redis"]) == (2, 2, 0)
    assert (b["from_workers"], b["own_echoes"], b["from_redis"]) == (0, 0, 2)
    subscriber.close()


def endpoint_status(port: int) -> dict:
    from dashboard.endpoint_status import endpoint_statuses

    found = [e for e in endpoint_statuses() if e["endpoint"].endswith(f":{port}")]
    assert len(found) == 1, [e["endpoint"] for e in endpoint_statuses()]
    return found[0]


def cluster_commands(port: int, settle: float = 1.0) -> dict:
    """The endpoint's REMOTE_SERVER_UP/LOCK_RELEASED counters, once its published status
    has caught up with what the test saw (it is written every 0.5 s)."""
    time.sleep(settle)
    return endpoint_status(port)["cluster_commands"]


def subscribers(client: redis.Redis, channel: str) -> int:
    return dict(client.pubsub_numsub(channel)).get(channel.encode(), 0)


@pytest.mark.django_db(transaction=True)
def test_a_redis_workers_cluster_commands_reach_each_tcp_worker_once(two_endpoints, redis_server):
    """REMOTE_SERVER_UP / LOCK_RELEASED published on Redis by a Redis-following worker reach
    the TCP workers of every endpoint, each exactly once (every endpoint hears Redis and
    hands it to its own connections only)."""
    from replication.protocol.commands import LockReleasedCommand, RemoteServerUpCommand
    from replication.worker.redis_worker import RedisReplicationWorker

    a_port, b_port = two_endpoints
    tcp_workers = [worker(a_port, "w-a1"), worker(a_port, "w-a2"), worker(b_port, "w-b")]
    client = redis.Redis.from_url(redis_server.url)
    wait_until(lambda: subscribers(client, SERVER_NAME) >= 2, "both endpoints subscribed on Redis")
    commands = [RemoteServerUpCommand("matrix.example"), LockReleasedCommand("rw", "purge", "!room:hs")]

    async def redis_worker_publishes() -> list[int]:
        rw = RedisReplicationWorker(name="rw", redis_url=redis_server.url, server_name=SERVER_NAME,
                                    catchup_url="http://127.0.0.1:9", streams=["typing"], log_interval=60)
        task = asyncio.create_task(rw.run())
        for _ in range(200):
            if rw.connected:
                break
            await asyncio.sleep(0.05)
        receivers = [await rw.publish(cmd) for cmd in commands]
        rw.stop()
        await asyncio.wait_for(task, 10)
        return receivers

    receivers = asyncio.run(redis_worker_publishes())
    assert all(n >= 3 for n in receivers)  # both endpoints and the worker itself
    expected = [cmd.to_line() for cmd in commands]
    for c in tcp_workers:
        assert commands_of(c, len(expected)) == expected
    for c in tcp_workers:
        assert [line for line in lines_of(c, 0.5) if not line.startswith("POSITION")] == []
    for port in (a_port, b_port):
        counts = cluster_commands(port, settle=0)
        assert (counts["from_redis"], counts["from_workers"], counts["own_echoes"]) == (2, 0, 0)
    client.close()


@pytest.mark.django_db(transaction=True)
def test_user_ip_published_on_redis_lands_once_and_survives_a_handover(two_endpoints, redis_server):
    """USER_IP on ``<server_name>/USER_IP`` (what Synapse's workers publish for the main
    process) is recorded into user_ips by exactly one endpoint (the lease holder); when it
    stops, the other takes over."""
    a_port, b_port = two_endpoints
    client = redis.Redis.from_url(redis_server.url)
    channel = f"{SERVER_NAME}/USER_IP"
    wait_until(lambda: subscribers(client, channel) == 1, "one endpoint subscribed to USER_IP")
    client.publish(channel, 'USER_IP @carol:hs ["tokc","10.1.1.1","Element",null,5000]')
    client.publish(channel, 'USER_IP not-a-user ["t","10.1.1.1","x",null,1]')  # refused, counted
    client.publish(channel, "REPLICATE ")  # not USER_IP: refused, counted
    wait_until(lambda: UserIp.objects.filter(user_id="@carol:hs").exists(), "carol's row")

    def from_redis():
        found = {port: endpoint_status(port) for port in (a_port, b_port)}
        return found if sum(s["user_ips_from_redis"]["heard"] for s in found.values()) == 1 else None

    time.sleep(1.0)  # a second recorder would have written by now (flush every 0.2 s)
    found = wait_until(from_redis, "the holder's counters")
    holders = [port for port, s in found.items() if s["user_ips_from_redis"]["holding"]]
    assert len(holders) == 1
    assert found[holders[0]]["user_ips_from_redis"] == {"holding": True, "heard": 1, "refused": 2}
    assert sum(s["user_ips"]["received"] for s in found.values()) == 1
    assert list(UserIp.objects.values_list("user_id", "ip", "user_agent", "device_id", "last_seen")) == [
        ("@carol:hs", "10.1.1.1", "Element", None, 5000)]

    # The holder stops (releasing the lease): the other endpoint records from then on.
    holder = two_endpoints.procs[two_endpoints.index(holders[0])]
    holder.terminate()
    holder.wait(timeout=15)
    other = b_port if holders[0] == a_port else a_port
    wait_until(lambda: subscribers(client, channel) == 1
               and endpoint_status(other)["user_ips_from_redis"]["holding"], "the other endpoint took over")
    client.publish(channel, 'USER_IP @dave:hs ["tokd","10.2.2.2","Element","DEV",6000]')
    wait_until(lambda: UserIp.objects.filter(user_id="@dave:hs").exists(), "dave's row, after the handover")
    assert UserIp.objects.count() == 2
    client.close()


@pytest.mark.django_db(transaction=True)
def test_user_ip_lands_in_user_ips(two_endpoints):
    a_port, b_port = two_endpoints
    a, b = worker(a_port, "w-a"), worker(b_port, "w-b")
    a.send(*[f'USER_IP @alice:hs ["tok1","10.0.0.1","Firefox","DEVA",{1000 + n}]' for n in range(50)])
    b.send('USER_IP @bob:hs ["tok2","10.0.0.2","curl",null,2000]',
           'USER_IP @alice:hs ["tok1","10.0.0.9","Firefox","DEVA",3000]')
    wait_until(lambda: UserIp.objects.count() == 3 and UserIp.objects.filter(last_seen=1049).exists(),
               "three user_ips rows, the latest sighting of each")
    rows = sorted(UserIp.objects.values_list("user_id", "access_token", "ip", "user_agent", "device_id", "last_seen"))
    from dashboard.endpoint_status import endpoint_statuses

    def counters():
        found = [e["user_ips"] for e in endpoint_statuses()]
        done = sum(c["received"] for c in found) == 52 and not any(c["pending"] for c in found)
        return found if done else None

    found = wait_until(counters, "both endpoints' USER_IP counters")
    assert sorted(c["received"] for c in found) == [2, 50] and sum(c["refused"] for c in found) == 0
    # coalesced: alice's 50 sightings are one row per write, not 50 writes
    assert 3 <= sum(c["written"] for c in found) <= 4 and sum(c["writes"] for c in found) <= 4
    assert rows == [("@alice:hs", "tok1", "10.0.0.1", "Firefox", "DEVA", 1049),
                    ("@alice:hs", "tok1", "10.0.0.9", "Firefox", "DEVA", 3000),
                    ("@bob:hs", "tok2", "10.0.0.2", "curl", None, 2000)]


@pytest.mark.django_db(transaction=True)
def test_user_sync_shown_per_user_and_cleared(two_endpoints, admin_client):
    from dashboard.endpoint_status import endpoint_statuses

    a_port, b_port = two_endpoints
    a, b = worker(a_port, "w-a"), worker(b_port, "w-b")
    a.send("USER_SYNC inst1 @alice:hs DEV1 start 100", "USER_SYNC inst2 @alice:hs None start 200",
           "USER_SYNC inst1 @bob:hs DEV9 start 300")
    b.send("USER_SYNC binst @alice:hs DEV3 start 400")

    def reports():
        return syncing_by_user(endpoint_statuses()).get("@alice:hs", [])

    wait_until(lambda: len(reports()) == 3, "alice reported by three syncing processes")
    assert sorted((r["connection"], r["instance_id"], r["device_id"]) for r in reports()) == [
        ("w-a", "inst1", "DEV1"), ("w-a", "inst2", None), ("w-b", "binst", "DEV3")]
    page = admin_client.get("/connections/users/?user=@alice:hs").content.decode().replace("<wbr>", "")
    assert page.count('<tr class="sync">') == 3 and "binst" in page and "@bob:hs" not in page
    # the last sync as a time, its milliseconds on hover (not a bare epoch number)
    assert 'title="400 ms since 1970-01-01 UTC"' in page and "<th>Last sync</th>" in page

    a.send("CLEAR_USER_SYNC inst2", "USER_SYNC inst1 @alice:hs DEV1 end 500")
    wait_until(lambda: [r["instance_id"] for r in reports()] == ["binst"], "only w-b's report left")
    assert "@bob:hs" in syncing_by_user(endpoint_statuses())
    b.close()  # the connection goes: its reports with it
    wait_until(lambda: reports() == [], "alice no longer reported")
    assert admin_client.get("/connections/users/?user=@alice:hs").content.decode().count('<tr class="sync">') == 0


def test_commands_in_this_file_parse():
    """The lines the tests send are valid commands (else the tests would test ERROR paths)."""
    assert isinstance(parse_line("CLEAR_USER_SYNC inst2"), ClearUserSyncCommand)
    assert isinstance(parse_line("USER_SYNC inst1 @alice:hs DEV1 end 500"), UserSyncCommand)


@pytest.mark.django_db(transaction=True)  # write_user_ips closes its connection
def test_user_ips_admin_is_read_only_and_hides_tokens(admin_client):
    write_user_ips([("@alice:hs", "syt_secret_token_abcd", "10.0.0.1", "Firefox", "D1", 1_700_000_000_000),
                    ("@bob:hs", "tok", "10.0.0.2", "curl", None, 10**17)])  # a peer's odd clock
    # (IDs carry a <wbr> after each separator, common.breakable: compared as read)
    page = admin_client.get("/admin/replication/userip/").content.decode().replace("<wbr>", "")
    assert "@alice:hs" in page and "10.0.0.1" in page and "…abcd" in page
    assert "syt_secret_token" not in page
    assert "2023-11-14 22:13:20 UTC" in page and "100000000000000000" in page  # a date; the odd clock as is
    filtered = admin_client.get("/admin/replication/userip/?by_user_id=@bob:hs").content.decode().replace("<wbr>", "")
    assert "@bob:hs" in filtered and "@alice:hs" not in filtered
    row = UserIp.objects.get(user_id="@alice:hs")
    assert "syt_secret_token" not in admin_client.get(f"/admin/replication/userip/{row.pk}/change/").content.decode()
    assert admin_client.get("/admin/replication/userip/add/").status_code == 403
    assert admin_client.post(f"/admin/replication/userip/{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert UserIp.objects.count() == 2


def test_federation_acks_kept_bounded_for_operators():
    from types import SimpleNamespace

    from replication.endpoint.connection_records import MAX_FEDERATION_ACKS, record_federation_ack
    from replication.protocol.commands import FederationAckCommand

    info = SimpleNamespace(federation_acks={})
    for n in range(MAX_FEDERATION_ACKS + 5):
        record_federation_ack(info, FederationAckCommand(f"fed{n}", n))
    record_federation_ack(info, FederationAckCommand("fed0", 99))  # a known sender moves on
    record_federation_ack(info, FederationAckCommand("bad\x00", 1))
    assert len(info.federation_acks) == MAX_FEDERATION_ACKS and info.federation_acks["fed0"] == 99
