"""The endpoint's consumer in process: Channels' ApplicationCommunicator plays the TCP adapter
(``replication.connect`` / ``receive`` / ``disconnect`` in, ``replication.send`` / ``close``
out) and the relay is a real ``ReplicationRelay`` that is never started, so each rule is
checked without a socket, a subprocess or a database."""
from __future__ import annotations

import asyncio
import time

import pytest
from channels.testing import ApplicationCommunicator

from replication.endpoint.consumer import ReplicationConsumer
from replication.endpoint.endpoint_record import Endpoint
from replication.endpoint.relay import ReplicationRelay
from replication.protocol.commands import PositionCommand, parse_line
from replication.protocol.line_batch import LineBatch, WriterRun, build_lines, counts_of


class Peer:
    """One worker's view of a consumer: what it sends, and every line it got back."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.app = ApplicationCommunicator(ReplicationConsumer.as_asgi(),
                                           {"type": "replication", "endpoint": endpoint, "client": ("127.0.0.1", 1)})
        self.lines: list[str] = []
        self.closed = False

    async def connect(self) -> None:
        await self.app.send_input({"type": "replication.connect", "peer": "127.0.0.1:1"})

    async def send(self, text: str) -> None:
        await self.app.send_input({"type": "replication.receive", "bytes": text.encode()})

    async def read(self, timeout: float = 1.0) -> list[str]:
        """Every line sent until nothing more comes for a moment."""
        while True:
            try:  # not receive_output(): its timeout cancels the application
                out = await asyncio.wait_for(self.app.output_queue.get(), timeout)
            except asyncio.TimeoutError:
                return self.lines
            timeout = 0.05
            if out["type"] == "replication.send":
                lines = out["bytes"].decode().splitlines()
                assert len(lines) == out["count"]  # the adapter counts commands by it
                self.lines.extend(lines)
            elif out["type"] == "replication.close":
                self.closed = True

    async def disconnect(self) -> None:
        await self.app.send_input({"type": "replication.disconnect", "reason": "connection lost"})
        await self.app.wait(1)


@pytest.fixture
def endpoint():
    relay = ReplicationRelay(poll_interval=60)
    relay.last_sent.update({("receipts", "master"): 5, ("events", "w1"): 9})
    return Endpoint.build("test.example", relay)


def run(coro):
    return asyncio.run(coro)


def test_greets_then_announces_positions_on_replicate(endpoint):
    async def go():
        peer = Peer(endpoint)
        await peer.connect()
        first = list(await peer.read())
        await peer.send("NAME w9\nPING 1\nREPLICATE\n")
        after = (await peer.read())[len(first):]
        await peer.disconnect()
        return first, after

    first, after = run(go())
    assert first[0] == "SERVER test.example" and first[1].startswith("PING ")
    # every stream, as Synapse's send_positions_to_connection: those with facts where they
    # stand, the others (no fact yet) at their start, for each of their writers
    from streams.conf import stream_writers
    from streams.registry import STREAMS

    assert "POSITION events w1 9 9" in after and "POSITION receipts master 5 5" in after
    expected = {("events", "w1"), ("receipts", "master")} | {
        (name, w) for name, spec in STREAMS.items() if name not in ("events", "receipts")
        for w in stream_writers()[name] or ("master",)}
    assert [tuple(line.split()[1:3]) for line in after] == sorted(expected)
    start = {line.split()[1]: line.split()[3:] for line in after}
    assert start["typing"] == ["0", "0"] and start["to_device"] == ["1", "1"]
    assert endpoint.connections == {}  # gone with its disconnect
    assert endpoint.counters.disconnects["connection lost"] == 1


def test_relayed_lines_only_after_replicate(endpoint):
    lines = build_lines("receipts", "master", 5, 7, [(6, [["!r", "m.read", "@u", "$e", None, {}]]), (7, [])])
    data = ("\n".join(lines) + "\n").encode()

    async def go():
        peer = Peer(endpoint)
        await peer.connect()
        await peer.read()
        batch = LineBatch.of_run(WriterRun("receipts", "master", 5, 7, data, counts_of(lines)))
        await endpoint.relay._send(batch)  # before REPLICATE: not for this worker
        before = list(await peer.read())
        await peer.send("REPLICATE\n")
        announced = list(await peer.read())
        endpoint.relay.last_sent[("receipts", "master")] = 7
        await endpoint.relay._send(batch)
        got = (await peer.read())[len(announced):]
        await peer.disconnect()
        return before, got

    before, got = run(go())
    assert not any(line.startswith("RDATA") for line in before)
    assert got == lines
    assert endpoint.counters.rdata_sent == 1 and endpoint.counters.position_sent >= 1


def test_a_bad_line_gets_error_and_close(endpoint):
    async def go():
        peer = Peer(endpoint)
        await peer.connect()
        await peer.send("NAME w9\nRDATA this is not allowed from a worker\n")
        await peer.read()
        await peer.disconnect()
        return peer

    peer = run(go())
    assert peer.lines[-1].startswith("ERROR ") and peer.closed
    assert endpoint.counters.disconnects["bad line"] == 1


def test_a_missed_batch_closes_the_connection(endpoint):
    async def go():
        peer = Peer(endpoint)
        await peer.connect()
        await peer.send("REPLICATE\n")
        await peer.read()
        deliver = endpoint.relay._connections[next(iter(endpoint.relay._connections))]
        for seq, data in ((1, b"POSITION receipts master 5 6\n"), (3, b"POSITION receipts master 6 8\n")):
            await deliver(seq, LineBatch.of_commands([parse_line(data.decode().strip())]))
        await peer.read()
        await peer.disconnect()
        return peer

    peer = run(go())
    assert peer.lines[-1] == "ERROR Failed to keep up" and peer.closed


def test_relayed_lines_count_as_sent_so_no_ping_while_they_flow(endpoint):
    """Synapse's server pings after PING_INTERVAL of silence; lines relayed from the writers
    are not silence (they went past the state machine before, which then pinged every 5 s)."""
    async def go():
        peer = Peer(endpoint)
        await peer.connect()
        await peer.send("REPLICATE\n")
        await peer.read()
        (deliver,) = endpoint.relay._connections.values()  # the consumer's bound relayed
        conn = deliver.__self__.conn
        conn.last_sent -= 60  # as if the last command was sent a minute ago
        assert conn.ping_due(time.time())
        endpoint.relay.last_sent[("receipts", "master")] = 6
        await endpoint.relay._send(LineBatch.of_commands([PositionCommand("receipts", "master", 5, 6)]))  # delivered in this call
        due = conn.ping_due(time.time())
        await peer.disconnect()
        return due

    assert run(go()) is False
