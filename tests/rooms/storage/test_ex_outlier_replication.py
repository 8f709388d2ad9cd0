"""A de-outliered event reaches workers on the events stream as Synapse sends it:
an ``ev`` row, now with ``outlier`` false, at the new position its ``ex_outlier_stream`` row
took (the event keeps its own stream ordering). Over the real protocol: the writer persists
in this process and publishes through Redis, ``runreplication`` serves a worker on a socket;
what the worker receives live equals what catch-up (``get_updates_since``) returns for the
same range: every token once, in order, no gap."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from replication.protocol.commands import PositionCommand, RdataCommand, parse_line
from rooms.storage import IncomingEvent, persist_events
from rooms.storage.caches import storage_caches
from streams.conf import stream_writers
from streams.registry import get_stream
from streams.runtime import StreamRuntime
from streams.updates_since import get_updates_since
from testing.processes import stop_process, wait_port
from testing.services import free_port
from tests.rooms.storage.helpers import rows
from tests.rooms.storage.test_matrix_persist import A, M, new_room, pdu_bytes

ROOT = Path(__file__).resolve().parents[3]
SERVER_NAME = "test.example"
WRITERS = "events=master"
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def endpoint(pg_url, tmp_path, redis_server):
    port = free_port()
    with open(tmp_path / "endpoint.log", "w") as log:
        env = dict(os.environ, DATABASE_URL=pg_url, SERVER_NAME=SERVER_NAME, POSITION_POLL_SECONDS="0.05",
                   STREAM_WRITERS=WRITERS, PYTHONUNBUFFERED="1", REDIS_URL=redis_server.url)
        proc = subprocess.Popen([sys.executable, "manage.py", "runreplication", "--listen", f"127.0.0.1:{port}"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc, tmp_path / "endpoint.log")
        yield port
    finally:
        stop_process(proc)


@pytest.fixture
def writer(redis_server):
    from channels_redis.pubsub import RedisPubSubChannelLayer

    storage_caches().forget()
    rt = StreamRuntime(instance_name="master", writers=stream_writers(WRITERS))
    rt.stream_replication(layer=RedisPubSubChannelLayer(hosts=[redis_server.url]))
    yield rt
    rt.close()
    storage_caches().forget()


def events_rdata(sock_file, upto: int) -> list[tuple[int, list]]:
    """The events stream's RDATA rows up to token ``upto``, as ``(token, row)`` (a batch's
    rows take the token of its last line)."""
    got: list[tuple[int, list]] = []
    pending: list[list] = []
    while not got or got[-1][0] < upto:
        line = sock_file.readline()
        assert line, f"connection closed after {got}"
        cmd = parse_line(line.rstrip("\n"))
        if isinstance(cmd, RdataCommand) and cmd.stream_name == "events":
            assert cmd.instance_name == "master"
            pending.append(cmd.row)
            if cmd.token is not None:
                got.extend((cmd.token, row) for row in pending)
                pending = []
        elif isinstance(cmd, PositionCommand) and cmd.stream_name == "events":
            assert not pending  # a batch is never cut by a POSITION
    return got


def test_a_de_outliered_event_is_an_ev_row_at_its_new_position(endpoint, writer):
    import socket

    sock = socket.create_connection(("127.0.0.1", endpoint), timeout=20)
    f = sock.makefile("r", encoding="utf-8")
    assert f.readline().startswith("SERVER ")
    sock.sendall(b"NAME test-worker\nREPLICATE\n")
    start = writer.generator("events").get_current_token_for_writer("master")

    room = new_room("10")
    room.send(M, "m.room.member", {"membership": "join"}, state_key=M)
    topic = room.send(A, "m.room.topic", {"topic": "hello"}, state_key="")
    msg = room.send(M, "m.room.message", {"body": "hi"})
    persist_events([pdu_bytes(room, e) for e in room.order[:-2]], runtime=writer)
    (outlier,) = persist_events([IncomingEvent(pdu_bytes(room, topic), outlier=True)], runtime=writer)
    (again,) = persist_events([IncomingEvent(pdu_bytes(room, topic))], runtime=writer)
    (last,) = persist_events([pdu_bytes(room, msg)], runtime=writer)
    ((ex_stream,),) = rows("SELECT event_stream_ordering FROM ex_outlier_stream WHERE event_id = %s", topic)
    assert again.stream_ordering == outlier.stream_ordering < ex_stream < last.stream_ordering

    live = events_rdata(f, last.stream_ordering)
    sock.close()
    catch_up = get_updates_since(get_stream("events"), "master", start, last.stream_ordering, limit=1000)
    assert not catch_up.limited
    # live RDATA and catch-up agree row for row, but for the outlier's first row: sent when it
    # was written, it said outlier; catch-up reads the row as it is now (as Synapse's does)
    first = [i for i, (t, row) in enumerate(live) if t == outlier.stream_ordering]
    assert len(first) == 1 and live[first[0]][1][1][-1] is True
    assert catch_up.updates[first[0]][1][1][-1] is False
    catch_up.updates[first[0]][1][1][-1] = True
    assert live == catch_up.updates
    tokens = [t for t, _ in live]
    assert tokens == sorted(tokens)
    # every position of the range is a token with rows: no gap, each once
    assert sorted(set(tokens)) == list(range(start + 1, last.stream_ordering + 1))

    ev_rows = [(t, row[1]) for t, row in live if row[0] == "ev" and row[1][0] == topic]
    assert ev_rows == [
        # first as it arrived: an outlier
        (outlier.stream_ordering, [topic, room.room_id, "m.room.topic", "", None, None, None, False, True]),
        # then de-outliered, at the ex_outlier_stream position
        (ex_stream, [topic, room.room_id, "m.room.topic", "", None, None, None, False, False]),
    ]
    # its state row (the topic became current state) comes with it, after the ev row
    at_ex = [row for t, row in live if t == ex_stream]
    assert [r[0] for r in at_ex] == ["ev", "state"]
    assert at_ex[1][1] == [room.room_id, "m.room.topic", "", topic]
