"""Synapse's own replication client as a peer of our endpoint (tests).

``python -m testing.synapse_tcp_client --connect HOST:PORT --server-name NAME --jsonl PATH``
runs Synapse 1.163.2's ``ClientReplicationStreamProtocol`` (``synapse/replication/tcp/
protocol.py``) unchanged on Twisted's reactor: Twisted's ``LineOnlyReceiver`` framing
(``MAX_LENGTH`` 16384: a longer line is answered ``ERROR Line length exceeded`` and the
connection closed), Synapse's command parser, its ``NAME``/``REPLICATE``/``PING`` and its
ping timeout. Only the command handler is ours: it records, one JSON line each, the
connection (``{"event": "connected"}``), every ``RDATA``/``POSITION`` (its stream, writer and
token; a typing row parsed by Synapse's ``TypingStream`` row type gives its user count) and
the connection's end (``{"event": "lost"}``), after which the process exits.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, TextIO


class RecordingHandler:
    """The ``ReplicationCommandHandler`` calls the protocol makes, written down."""

    def __init__(self, out: TextIO, reactor: Any) -> None:
        self.out = out
        self.reactor = reactor

    def _write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def new_connection(self, connection: Any) -> None:
        self._write({"event": "connected"})

    def lost_connection(self, connection: Any) -> None:
        self._write({"event": "lost"})
        if self.reactor.running:
            self.reactor.stop()

    def on_RDATA(self, connection: Any, cmd: Any) -> None:
        from synapse.replication.tcp.streams import STREAMS_MAP

        record = {"event": "RDATA", "stream": cmd.stream_name, "writer": cmd.instance_name, "token": cmd.token}
        if cmd.stream_name == "typing":
            record["users"] = len(STREAMS_MAP["typing"].parse_row(cmd.row).user_ids)
        self._write(record)

    def on_POSITION(self, connection: Any, cmd: Any) -> None:
        self._write({"event": "POSITION", "stream": cmd.stream_name, "writer": cmd.instance_name,
                     "prev": cmd.prev_token, "new": cmd.new_token})

    def on_ERROR(self, connection: Any, cmd: Any) -> None:
        self._write({"event": "ERROR", "text": cmd.data})


class _Homeserver:
    """What the protocol asks of its homeserver: background processes (our handler returns
    no awaitables, so none are started)."""

    def run_as_background_process(self, desc: str, func: Any, *args: Any, **kwargs: Any) -> Any:
        from twisted.internet import defer

        return defer.ensureDeferred(func(*args, **kwargs))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connect", required=True, help="HOST:PORT of the replication endpoint")
    parser.add_argument("--server-name", required=True)
    parser.add_argument("--name", default="synapse-client")
    parser.add_argument("--jsonl", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from synapse.replication.tcp.protocol import ClientReplicationStreamProtocol
    from synapse.util.clock import Clock
    from twisted.internet import reactor
    from twisted.internet.protocol import ClientFactory

    host, port = args.connect.rsplit(":", 1)
    out = open(args.jsonl, "a")
    handler = RecordingHandler(out, reactor)
    clock = Clock(reactor, server_name=args.server_name)

    class Factory(ClientFactory):
        def buildProtocol(self, addr: Any) -> ClientReplicationStreamProtocol:
            return ClientReplicationStreamProtocol(_Homeserver(), args.name, args.server_name, clock, handler)

        def clientConnectionFailed(self, connector: Any, reason: Any) -> None:
            handler._write({"event": "failed", "reason": str(reason)})
            reactor.stop()

    reactor.connectTCP(host, int(port), Factory())
    reactor.run()


if __name__ == "__main__":
    main()
