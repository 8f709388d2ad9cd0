"""Our Redis worker following a real Synapse homeserver (docs/replication.md,
"Following a real Synapse").

One Synapse 1.163.2 main process (``testing/synapse_homeserver.py``, the ``synapse`` fixture of
tests/interop/conftest.py) runs for the whole session on the suite's PostgreSQL (its own
C-collation database) and Redis; users drive it through the client-server API. ``manage.py
replication_worker --redis`` follows its channel, fetching gaps from Synapse's replication
listener with its ``worker_replication_secret``, and records every fact in a ``--jsonl`` file.
The oracle is Synapse's own tables: every event it persisted must be in the file exactly once,
at its ``stream_ordering``. Cases: a worker started before the traffic, one started after it
(catch-up, then live), one SIGKILLed mid-stream and restarted from its file, and Synapse
restarted under a following worker (its in-memory ``typing`` stream starts again from 0).
Synapse failing to start fails the module; nothing is skipped.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest

from testing.processes import ROOT, jsonl_records, stop_process
from testing.services import free_port
from testing.synapse_homeserver import ClientApi, SynapseHomeserver
from tests.interop.conftest import SERVER_NAME

#: Streams Synapse and this project both have, followed by the worker.
STREAMS = "events,backfill,typing,receipts,caches,to_device,account_data"
#: Generous: a loaded 2-core CI machine. Waiting is by polling; this only bounds a failure.
WAIT = 60.0

pytestmark = [pytest.mark.slow]


# --- fixtures ----------------------------------------------------------------------------------


#: the session's Synapse outlives this module's fixtures: pytest-django runs the
#: transactional test first, so another module's tests may come between it and the rest, and
#: ``users`` is made again then, under new names
_USER_SETS = itertools.count()


class Users:
    """Two users in one room: what the traffic needs."""

    def __init__(self, homeserver: SynapseHomeserver) -> None:
        n = next(_USER_SETS)
        self.alice = homeserver.register(f"alice{n or ''}")
        self.bob = homeserver.register(f"bob{n or ''}")
        self.room = self.alice.create_room(name="interop")
        self.alice.invite(self.room, self.bob.user_id)
        self.bob.join(self.room)


@pytest.fixture(scope="module")
def users(synapse):
    return Users(synapse)


def traffic(users: Users, tag: str, messages: int = 3) -> dict[str, Any]:
    """Messages, a state change, typing, a read receipt, account data and a to-device
    message, through the client-server API. Returns what a worker should then have."""
    alice, bob, room = users.alice, users.bob, users.room
    events = [alice.send_message(room, f"{tag} message {i}") for i in range(messages)]
    events.append(alice.set_topic(room, f"topic {tag}"))
    alice.typing(room)
    bob.read_receipt(room, events[0])
    data_type = f"org.example.{tag}"
    alice.account_data(data_type, {"tag": tag})
    alice.send_to_device(bob.user_id, bob.device_id, "org.example.ping", {"tag": tag})
    events.append(bob.send_message(room, f"{tag} reply"))
    return {"events": events, "receipt": (room, bob.user_id, events[0]),
            "account_data": (alice.user_id, data_type), "to_device": bob.user_id,
            "typing": (room, alice.user_id)}


# --- the worker process ------------------------------------------------------------------------


class WorkerProcess:
    """``manage.py replication_worker --redis`` following Synapse, writing ``jsonl``."""

    def __init__(self, homeserver: SynapseHomeserver, redis_url: str, tmp: Path, name: str,
                 extra: list[str] | None = None) -> None:
        self.homeserver, self.redis_url, self.name = homeserver, redis_url, name
        self.jsonl = tmp / f"{name}.jsonl"
        self.log = tmp / f"{name}.log"
        self.state = tmp / f"{name}-state"
        self.state.mkdir(exist_ok=True)
        self.extra = extra if extra is not None else ["--catchup-url", homeserver.replication_url]
        self.proc: subprocess.Popen | None = None

    def start(self) -> "WorkerProcess":
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "synapse_repl.settings", "LOG_LEVEL": "INFO",
               "REDIS_URL": "", "STATE_DIR": str(self.state),
               "REPLICATION_SECRET": self.homeserver.replication_secret}
        env.pop("DATABASE_URL", None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "replication_worker", "--name", self.name, "--redis",
                 "--redis-url", self.redis_url, "--server-name", SERVER_NAME, "--streams", STREAMS,
                 "--jsonl", str(self.jsonl), *self.extra],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.subscriptions = self.log_text().count("replication subscribed")
        wait_for(lambda: self.log_text().count("replication subscribed") > self.subscriptions,
                 f"{self.name} subscribed to Synapse's channel", self)
        return self

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def records(self) -> list[dict]:
        return jsonl_records(self.jsonl)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        """SIGTERM; the worker must exit cleanly, having parsed every line Synapse published
        (LOCK_RELEASED and the commands of streams we do not have included)."""
        assert "malformed" not in self.log_text(), self.log_text()[-3000:]
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.name} ignored SIGTERM:\n{self.log_text()[-3000:]}") from None
        assert status == 0, self.log_text()[-3000:]


@pytest.fixture
def worker_factory(synapse, redis_server, tmp_path):
    started: list[WorkerProcess] = []

    def make(name: str, extra: list[str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(synapse, redis_server.url, tmp_path, name, extra)
        started.append(worker)
        return worker

    yield make
    for worker in started:
        if worker.proc is not None and worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()


def wait_for(predicate: Callable[[], Any], what: str, worker: WorkerProcess | None = None,
             timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if worker is not None and worker.proc is not None and worker.proc.poll() is not None:
            raise AssertionError(f"{worker.name} exited ({worker.proc.returncode}) while waiting for "
                                 f"{what}:\n{worker.log_text()[-3000:]}")
        if time.monotonic() > deadline:
            log = worker.log_text()[-3000:] if worker is not None else ""
            raise AssertionError(f"timed out waiting for {what}\n{log}")
        time.sleep(0.1)


# --- the checks --------------------------------------------------------------------------------


def received_events(records: list[dict]) -> list[tuple[int, str, str]]:
    """(token, event_id, type) of every ``ev`` row the worker recorded, in file order."""
    return [(r["token"], row[1][0], row[1][2]) for r in records if r["stream"] == "events"
            for row in r["rows"] if row[0] == "ev"]


def wait_for_every_event(worker: WorkerProcess, homeserver: SynapseHomeserver) -> None:
    """Until the worker has every event Synapse's ``events`` table holds, then check it has
    each exactly once, at its stream_ordering, and nothing else."""
    def complete() -> bool:
        return set(received_events(worker.records())) >= set(homeserver.persisted_events())

    wait_for(complete, "every persisted event in the worker's file", worker)
    expected = homeserver.persisted_events()
    records = worker.records()
    got = received_events(records)
    assert sorted(got) == expected, "each event exactly once at its stream position"
    assert all(r["writer"] == "master" for r in records if r["stream"] == "events")
    check_tokens_increase(records)


def check_tokens_increase(records: list[dict]) -> None:
    """Exactly once, in order: per (stream, writer) each token above the one before, except
    that typing starts again from 0 when Synapse restarts."""
    last: dict[tuple[str, str], int] = {}
    for r in records:
        key = (r["stream"], r["writer"])
        if key in last and r["stream"] != "typing":
            assert r["token"] > last[key], f"{key}: {r['token']} after {last[key]}"
        last[key] = r["token"]


def rows_of(records: list[dict], stream: str) -> list[tuple[int, list]]:
    return [(r["token"], row) for r in records if r["stream"] == stream for row in r["rows"]]


def wait_for_the_other_streams(worker: WorkerProcess, homeserver: SynapseHomeserver,
                               did: dict[str, Any]) -> None:
    """The traffic's receipt, account data, to-device message and typing reached the worker,
    and the latest receipt, account-data and to-device row Synapse holds per key arrived at
    its stream ID. (Synapse's catch-up returns only those: it keeps only the latest receipt per
    room, user and type and account data per user and type, and answers the latest to-device
    ID per user; a worker started late gets the latest, not every one.)"""
    room, user, event_id = did["receipt"]
    owner, data_type = did["account_data"]
    room_typing, typist = did["typing"]

    def arrived() -> bool:
        records = worker.records()
        return (any(row[0] == room and row[2] == user and row[3] == event_id
                    for _, row in rows_of(records, "receipts"))
                and any(row[0] == owner and row[2] == data_type for _, row in rows_of(records, "account_data"))
                and any(row[0] == did["to_device"] for _, row in rows_of(records, "to_device"))
                and any(row == [room_typing, [typist]] for _, row in rows_of(records, "typing")))

    wait_for(arrived, "the receipt, account data, to-device message and typing", worker)
    records = worker.records()
    for stream, sql in [
        ("receipts", "SELECT stream_id FROM receipts_linearized"),
        ("account_data", "SELECT stream_id FROM account_data UNION SELECT stream_id FROM room_account_data"),
        ("to_device", "SELECT max(stream_id) FROM device_inbox GROUP BY user_id"),
    ]:
        held = {row[0] for row in homeserver.query(sql)}
        tokens = {r["token"] for r in records if r["stream"] == stream}
        assert held and held <= tokens, (stream, sorted(held - tokens))
    check_tokens_increase(records)


def catch_up_txn_ids(homeserver: SynapseHomeserver) -> list[str]:
    """The txn_id of every catch-up request Synapse's access log shows (but the probes of
    ``test_synapse_answers_as_the_worker_expects``, which repeat one on purpose)."""
    found = re.findall(r"GET /_synapse/replication/get_repl_stream_updates/[^/\s]+/([^?\s/]+)\?",
                       homeserver.log_path.read_text(errors="replace"))
    return [txn_id for txn_id in found if not txn_id.startswith("interop-")]


# --- the cases ---------------------------------------------------------------------------------


def test_synapse_answers_as_the_worker_expects(synapse, users):
    """What the worker relies on, asked of Synapse itself: the form without a txn_id is 404
    M_UNRECOGNIZED, and an answer is kept under its txn_id (the ID alone: another stream's
    path gets it too). Our endpoint does the same (tests/replication/http/test_catchup.py)."""
    auth = {"Authorization": f"Bearer {synapse.replication_secret}"}
    base = f"{synapse.replication_url}/_synapse/replication/get_repl_stream_updates"

    def get(path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(urllib.request.Request(base + path, headers=auth), timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    status, body = get("/events?from_token=0&upto_token=1")
    assert (status, body["errcode"]) == (404, "M_UNRECOGNIZED")
    status, first = get("/events/interop-same-id?from_token=0&upto_token=1000")
    assert status == 200 and first["updates"], first
    assert get("/typing/interop-same-id?from_token=0&upto_token=5") == (200, first)
    status, typing = get("/typing/interop-fresh-id?from_token=0&upto_token=5")
    assert status == 200 and typing != first


def test_worker_started_before_the_traffic(synapse, users, worker_factory):
    worker = worker_factory("before").start()
    did = traffic(users, "before")
    wait_for_every_event(worker, synapse)
    wait_for_the_other_streams(worker, synapse, did)
    assert set(did["events"]) <= {e for _, e, _ in received_events(worker.records())}
    worker.stop()


def test_worker_started_after_the_traffic(synapse, users, worker_factory):
    """Everything so far through catch-up, then live. The catch-up URL given for writers in
    general is dead: only --instance-url master=... reaches Synapse, so the map is used."""
    traffic(users, "after-1")
    txn_ids_before = len(catch_up_txn_ids(synapse))
    worker = worker_factory("after", ["--catchup-url", f"http://127.0.0.1:{free_port()}",
                                      "--instance-url", f"master={synapse.replication_url}"]).start()
    wait_for_every_event(worker, synapse)
    # Synapse logs a request once its answer is sent: maybe just after the worker has it.
    wait_for(lambda: len(catch_up_txn_ids(synapse)) > txn_ids_before,
             "Synapse's access log to show the catch-up requests that brought the history", worker)
    did = traffic(users, "after-2")
    wait_for_every_event(worker, synapse)
    wait_for_the_other_streams(worker, synapse, did)
    worker.stop()
    txn_ids = catch_up_txn_ids(synapse)
    assert len(txn_ids) == len(set(txn_ids)), "a txn_id was sent twice"


def test_worker_killed_mid_stream_resumes_from_its_file(synapse, users, worker_factory):
    worker = worker_factory("killed").start()
    wait_for_every_event(worker, synapse)  # the history, caught up
    before = len(received_events(worker.records()))
    burst = threading.Thread(target=traffic, args=(users, "burst"), kwargs={"messages": 40})
    burst.start()
    try:
        wait_for(lambda: len(received_events(worker.records())) >= before + 10,
                 "the burst under way", worker)
        worker.kill()  # SIGKILL: whatever it was writing, it does not finish
        assert burst.is_alive(), "the burst ended before the kill: it is not mid-stream"
        time.sleep(0.5)
        worker.start()  # the same file: it resumes where the file ends
    finally:
        burst.join()
    wait_for_every_event(worker, synapse)
    worker.stop()


def test_synapse_restarted_while_the_worker_follows(synapse, users, worker_factory):
    worker = worker_factory("restart").start()
    did = traffic(users, "pre-restart")
    wait_for_every_event(worker, synapse)
    wait_for_the_other_streams(worker, synapse, did)
    for typing in (False, True, False, True):  # move the typing stream on a few tokens
        users.alice.typing(users.room, typing)
    wait_for(lambda: max(t for t, _ in rows_of(worker.records(), "typing")) >= 4,
             "the typing stream at token 4 or above", worker)
    typing_before = max(t for t, _ in rows_of(worker.records(), "typing"))
    lines_before = len(worker.records())
    synapse.restart()  # its typing stream starts again at 0
    did = traffic(users, "post-restart")
    wait_for_every_event(worker, synapse)
    wait_for_the_other_streams(worker, synapse, did)
    new_typing = rows_of(worker.records()[lines_before:], "typing")
    assert new_typing and min(t for t, _ in new_typing) < typing_before, (typing_before, new_typing)
    assert "typing writer master restarted" in worker.log_text()
    worker.stop()


@pytest.mark.django_db(transaction=True)
def test_synapse_lock_released_reaches_a_tcp_worker_of_our_endpoint_once(synapse, users, pg_url,
                                                                          redis_server, tmp_path):
    """Synapse's main process publishes ``LOCK_RELEASED`` on Redis whenever it lets go of a
    worker lock (one per message sent: the room's new-event read lock). Our endpoint on the
    same Redis and server name hands it to its TCP workers, once. Last in the module: the
    endpoint announces our (empty) positions on Synapse's channel while it runs."""
    from tests.replication.endpoint.test_endpoint import LineClient

    port = free_port()
    log_path = tmp_path / "endpoint.log"
    env = {**os.environ, "DATABASE_URL": pg_url, "SERVER_NAME": SERVER_NAME, "REDIS_URL": redis_server.url,
           "REPLICATION_SECRET": synapse.replication_secret, "PYTHONUNBUFFERED": "1",
           "STATE_DIR": str(tmp_path / "state")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "manage.py", "runreplication", "--listen", f"127.0.0.1:{port}"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        from testing.processes import wait_port

        wait_port(port, proc, log_path)
        client = LineClient(port)
        assert client.read_line() == f"SERVER {SERVER_NAME}"
        client.send("NAME tcp-worker", "REPLICATE ")
        import redis

        oracle = redis.Redis.from_url(redis_server.url).pubsub()  # what Synapse published
        oracle.subscribe(SERVER_NAME)
        admin = redis.Redis.from_url(redis_server.url)
        wait_for(lambda: dict(admin.pubsub_numsub(SERVER_NAME)).get(SERVER_NAME.encode(), 0) >= 3,
                 "our endpoint subscribed beside Synapse and the oracle")
        admin.close()
        users.alice.send_message(users.room, "a lock is taken and released")
        expected = f'LOCK_RELEASED ["master","new_event_during_purge_lock","{users.room}"]'
        published, deadline = 0, time.monotonic() + WAIT
        while time.monotonic() < deadline and not published:
            message = oracle.get_message(timeout=1.0)
            if message and message["type"] == "message" and message["data"] == expected.encode():
                published += 1
        time.sleep(2.0)  # Synapse may release it more than once per message: count them all
        while (message := oracle.get_message(timeout=0.2)) is not None:
            published += message["type"] == "message" and message["data"] == expected.encode()
        oracle.close()
        assert published >= 1, "Synapse published no LOCK_RELEASED for the room"
        got, deadline = [], time.monotonic() + 5.0
        while time.monotonic() < deadline:  # the lines got by then
            try:
                line = client.read_line(max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                break
            assert line is not None, log_path.read_text(errors="replace")[-3000:]
            if line.startswith("LOCK_RELEASED"):
                got.append(line)
        # each of Synapse's publications exactly once, nothing else
        assert got == [expected] * published, (published, got, log_path.read_text(errors="replace")[-3000:])
        client.close()
    finally:
        stop_process(proc, timeout=15)
