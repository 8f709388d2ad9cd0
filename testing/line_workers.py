"""Many replication workers as raw sockets, read by one selector thread (tests, benchmarks).

A real worker (``manage.py replication_worker``) is a process of ~100 MiB: 200 of them do not
fit on a 2-core machine beside the endpoint they load. Here a worker is one TCP connection
that sends ``NAME``, ``PING`` and ``REPLICATE`` and a PING every few seconds (or the endpoint would drop
it for a ping timeout), and one thread reads every reading connection, keeping per connection
the ``RDATA`` tokens of one stream and writer and when each arrived (``time.time()``, to
compare with a writer's ``--stamps``). A *non-reading* worker never reads a byte: its receive
buffer is shrunk so the endpoint's send buffer fills soon, as with a stuck worker.

Used by tests/replication/endpoint/test_limits.py and benchmarks/bench_idle_workers.py.
"""
from __future__ import annotations

import selectors
import socket
import threading
import time
from array import array
from dataclasses import dataclass, field

#: What a non-reading worker asks of the kernel for its receive buffer (Linux doubles it).
IDLE_RCVBUF = 4096


@dataclass(eq=False)
class LineWorker:
    """One connection; ``tokens``/``arrivals`` are filled by the reading thread."""

    name: str
    sock: socket.socket
    reads: bool
    buffer: bytes = b""
    #: RDATA tokens of the followed stream and writer, in order of arrival
    tokens: array = field(default_factory=lambda: array("q"))
    #: ``time.time()`` at which each of ``tokens`` arrived
    arrivals: array = field(default_factory=lambda: array("d"))
    #: bytes of those RDATA lines, newlines included
    rdata_bytes: int = 0
    #: the endpoint handled REPLICATE (its POSITION lines came)
    replicating: bool = False
    errors: list[str] = field(default_factory=list)
    #: ``time.time()`` when the endpoint closed it (seen by reading workers only)
    closed_at: float | None = None

    @property
    def last_token(self) -> int:
        return self.tokens[-1] if self.tokens else 0


class LineWorkers:
    """Connections to one endpoint, read (and PINGed) by one daemon thread.

    ``stream``/``writer``: whose RDATA lines are recorded. Start with :meth:`connect` for each
    worker, then :meth:`wait_replicating`; :meth:`stop` closes everything.
    """

    def __init__(self, port: int, *, stream: str, writer: str = "master", host: str = "127.0.0.1",
                 ping_seconds: float = 5.0) -> None:
        self.address = (host, port)
        self.prefix = f"RDATA {stream} {writer} ".encode()
        self.ping_seconds = ping_seconds
        self.workers: list[LineWorker] = []
        self.selector = selectors.DefaultSelector()
        self._new: list[LineWorker] = []  # connected, for the thread to register
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="line-workers", daemon=True)
        self.thread.start()

    # -- the test's or benchmark's side ---------------------------------------------------------

    def connect(self, name: str, *, reads: bool = True) -> LineWorker:
        sock = socket.socket()
        if not reads:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, IDLE_RCVBUF)
        sock.settimeout(10)
        sock.connect(self.address)
        sock.sendall(f"NAME {name}\nPING {int(time.time() * 1000)}\nREPLICATE \n".encode())  # as Synapse
        sock.setblocking(False)
        worker = LineWorker(name, sock, reads)
        self.workers.append(worker)
        if reads:
            self._new.append(worker)
        return worker

    @property
    def reading(self) -> list[LineWorker]:
        return [w for w in self.workers if w.reads]

    @property
    def idle(self) -> list[LineWorker]:
        return [w for w in self.workers if not w.reads]

    def wait_replicating(self, timeout: float = 60) -> None:
        """Until every reading worker got its POSITION lines (the endpoint sends it RDATA)."""
        deadline = time.monotonic() + timeout
        while not all(w.replicating for w in self.reading):
            if time.monotonic() > deadline:
                waiting = [w.name for w in self.reading if not w.replicating]
                raise TimeoutError(f"no POSITION within {timeout} s for {waiting[:5]} ({len(waiting)})")
            time.sleep(0.02)

    def lowest_token(self) -> int:
        """The last token of the reading worker furthest behind."""
        return min((w.last_token for w in self.reading), default=0)

    def wait_for_token(self, token: int, timeout: float = 60) -> None:
        """Until every reading worker received ``token``; raises if one was closed or time ran out."""
        deadline = time.monotonic() + timeout
        while self.lowest_token() < token:
            closed = [w for w in self.reading if w.closed_at is not None]
            if closed:
                raise ConnectionError(f"{closed[0].name} was disconnected: {closed[0].errors}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"token {token} not received by all within {timeout} s "
                                   f"(lowest {self.lowest_token()})")
            time.sleep(0.005)

    def stop(self) -> None:
        self.stopping = True
        self.thread.join(10)
        for w in self.workers:
            w.sock.close()
        self.selector.close()

    # -- the reading thread ---------------------------------------------------------------------

    def _run(self) -> None:
        next_ping = time.monotonic() + self.ping_seconds
        while not self.stopping:
            while self._new:
                worker = self._new.pop()
                self.selector.register(worker.sock, selectors.EVENT_READ, worker)
            for key, _ in self.selector.select(0.02):
                self._read(key.data)
            if time.monotonic() >= next_ping:
                next_ping += self.ping_seconds
                self._ping()

    def _read(self, worker: LineWorker) -> None:
        try:
            chunk = worker.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        now = time.time()
        if not chunk:
            worker.closed_at = now
            self.selector.unregister(worker.sock)
            return
        *lines, worker.buffer = (worker.buffer + chunk).split(b"\n")
        prefix, cut = self.prefix, len(self.prefix)
        for line in lines:
            if line.startswith(prefix):
                worker.tokens.append(int(line[cut:line.index(b" ", cut)]))
                worker.arrivals.append(now)
                worker.rdata_bytes += len(line) + 1
            elif line.startswith(b"POSITION "):
                worker.replicating = True
            elif line.startswith(b"ERROR "):
                worker.errors.append(line[6:].decode(errors="replace"))

    def _ping(self) -> None:
        line = f"PING {int(time.time() * 1000)}\n".encode()
        for w in list(self.workers):
            if w.closed_at is None:
                try:
                    w.sock.send(line)
                except OSError:
                    pass  # gone or (never, for a few bytes) full: the endpoint decides
