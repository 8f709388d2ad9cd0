"""The TCP adapter (``tcp.ReplicationServerProtocol``) in process: an asyncio protocol fed
bytes by hand, writing to a fake transport -- first with a scripted application (the
adapter's own rules: events in, back-pressure, the outbound cap), then with the real consumer
(a malformed line gets ERROR and a close, end to end without a socket)."""
from __future__ import annotations

import asyncio

from replication.endpoint.consumer import ReplicationConsumer
from replication.endpoint.endpoint_record import Endpoint
from replication.endpoint.relay import ReplicationRelay
from replication.endpoint.tcp import ReplicationServerProtocol
from replication.protocol.line_batch import encode_run


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = self.aborted = False
        self.reading = True

    def pause_reading(self) -> None:
        assert self.reading
        self.reading = False

    def resume_reading(self) -> None:
        assert not self.reading
        self.reading = True

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 4242) if name == "peername" else default

    def write(self, data) -> None:
        assert not self.closed, "written after close"
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True


def endpoint() -> Endpoint:
    relay = ReplicationRelay(poll_interval=60)
    relay.last_sent[("receipts", "master")] = 5
    return Endpoint.build("test.example", relay)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_reading_pauses_while_the_consumer_is_behind():
    """A peer that sends faster than the consumer takes waits in TCP's flow control: past
    MAX_INBOX_BYTES received and not yet taken, the socket is not read; once half is taken,
    it is read again."""
    from replication.endpoint.tcp import MAX_INBOX_BYTES

    async def go() -> None:
        taking = asyncio.Event()
        taken: list[dict] = []

        async def app(scope, receive, send):
            await taking.wait()
            while True:
                taken.append(await receive())
                if transport.reading and len(taken) > 1:
                    return

        transport = FakeTransport()
        proto = ReplicationServerProtocol(endpoint(), app)
        proto.connection_made(transport)
        chunk = b"PING x\n" * 8192  # 56 KiB
        while transport.reading:
            proto.data_received(chunk)
        assert MAX_INBOX_BYTES < proto.inbox_bytes <= MAX_INBOX_BYTES + len(chunk)
        taking.set()
        await asyncio.wait_for(proto.task, 5)
        assert transport.reading and proto.inbox_bytes <= MAX_INBOX_BYTES // 2
        assert sum(len(e.get("bytes", b"")) for e in taken) + proto.inbox_bytes == len(chunk) * (
            (MAX_INBOX_BYTES // len(chunk)) + 1)

    asyncio.run(go())


def test_socket_events_reach_the_application_in_order():
    events: list[dict] = []

    async def go() -> list[dict]:
        finished = asyncio.Event()

        async def app(scope, receive, send):
            assert scope["type"] == "replication" and scope["protocol"] is proto
            while True:
                event = await receive()
                events.append(event)
                if event["type"] == "replication.disconnect":
                    finished.set()
                    return

        proto = ReplicationServerProtocol(endpoint(), app)
        proto.connection_made(FakeTransport())
        proto.data_received(b"NAME w1\n")
        proto.data_received(b"PING 1\n")
        proto.connection_lost(None)
        await asyncio.wait_for(finished.wait(), 5)
        return events

    got = asyncio.run(go())
    assert [e["type"] for e in got] == ["replication.connect", "replication.receive", "replication.receive",
                                        "replication.disconnect"]
    assert got[0]["peer"] == "127.0.0.1:4242" and got[1]["bytes"] == b"NAME w1\n"
    assert got[3]["reason"] == "shut down"  # an orderly close by the peer


def test_writes_wait_while_paused_and_too_many_close_with_an_error():
    async def go() -> tuple[FakeTransport, ReplicationServerProtocol, list[dict]]:
        sends: list = []

        async def app(scope, receive, send):
            sends.append(send)
            await asyncio.Event().wait()

        transport = FakeTransport()
        proto = ReplicationServerProtocol(endpoint(), app, max_pending=3)
        proto.connection_made(transport)
        await settle()
        send = sends[0]
        await send({"type": "replication.send", "bytes": b"A\n", "count": 1})
        proto.pause_writing()  # the socket's buffers are full
        await send({"type": "replication.send", "bytes": b"B\nC\n", "count": 2})
        assert bytes(transport.written) == b"A\n"  # B and C wait
        proto.resume_writing()
        assert bytes(transport.written) == b"A\nB\nC\n"
        proto.pause_writing()
        await send({"type": "replication.send", "bytes": b"D\nE\n", "count": 2})
        await send({"type": "replication.send", "bytes": b"F\nG\n", "count": 2})  # 4 > 3 waiting
        inbox = []
        while not proto.inbox.empty():
            inbox.append(proto.inbox.get_nowait())
        proto.task.cancel()
        return transport, proto, inbox

    transport, proto, inbox = asyncio.run(go())
    assert bytes(transport.written) == b"A\nB\nC\nERROR Failed to keep up\n" and transport.closed
    assert inbox[-1] == {"type": "replication.disconnect", "reason": "failed to keep up"}


def test_a_malformed_line_gets_error_and_a_clean_close_through_the_consumer():
    ep = endpoint()

    async def go() -> FakeTransport:
        transport = FakeTransport()
        proto = ReplicationServerProtocol(ep, ReplicationConsumer.as_asgi())
        proto.connection_made(transport)
        await settle()
        proto.data_received(b"NAME w1\nRDATA workers may not send this\n")
        for _ in range(100):
            if transport.closed:
                break
            await asyncio.sleep(0.01)
        proto.connection_lost(None)
        await asyncio.wait_for(proto.task, 5)
        return transport

    transport = asyncio.run(go())
    lines = bytes(transport.written).decode().splitlines()
    assert lines[0] == "SERVER test.example" and lines[1].startswith("PING ")
    assert lines[-1].startswith("ERROR ") and transport.closed
    assert ep.counters.disconnects["bad line"] == 1 and ep.connections == {}


def test_relayed_batches_are_counted_by_their_counts():
    ep = endpoint()

    async def go() -> FakeTransport:
        transport = FakeTransport()
        proto = ReplicationServerProtocol(ep, ReplicationConsumer.as_asgi())
        proto.connection_made(transport)
        proto.data_received(b"NAME w1\nREPLICATE\n")
        await settle()
        run, _, _ = encode_run("receipts", "master", 5, 8, [(6, [["a"]]), (7, [["b"], ["c"]])])
        await ep.relay.on_run(run)
        await settle()
        proto.connection_lost(None)
        await asyncio.wait_for(proto.task, 5)
        return transport

    transport = asyncio.run(go())
    text = bytes(transport.written).decode()
    assert 'RDATA receipts master batch ["b"]\nRDATA receipts master 7 ["c"]\nPOSITION receipts master 7 8\n' in text
    # REPLICATE's answer (a POSITION per stream) and the batch's
    assert ep.counters.rdata_sent == 3 and ep.counters.position_sent == text.count("POSITION ") > 2
