"""The worker's transport-independent half: a thin asyncio adapter around
:class:`~replication.worker.follower.StreamFollower` (docs/replication.md, "The worker").

A transport (:mod:`.tcp_worker`, :mod:`.redis_worker`) runs the *session* -- one connection,
until it drops -- and feeds the RDATA and POSITION it receives to :meth:`_dispatch_many`;
this class runs the follower's decisions:

* ``Deliver``/``Advanced``/``Reset`` go to the stream's *lane*: one queue, one consumer task
  and one thread (for blocking work) per stream, which applies ``caches`` rows to the Django
  cache (:mod:`.cache_invalidation`), then calls ``on_facts(stream, writer, token, rows)``. A
  slow callback only holds up its own stream; the reading loop, and so PING handling, never
  waits for it.
* ``FetchCatchUp`` becomes a task that GETs one page of the catch-up endpoint
  (:mod:`.catchup_client`, in a thread) -- the writer's own (``instance_urls``) or
  ``catchup_url`` -- and hands the result back to the follower, which answers with the rows to
  deliver and the next page, the end, or a retry after a back-off delay.

The follower guarantees the order of decisions (one catch-up in flight per stream, that
stream's commands parked behind it); each lane keeps that order to the callback. A lost
connection is retried forever with exponential back-off (:meth:`_connect_forever`: from
``RECONNECT_FIRST_DELAY`` doubling to ``RECONNECT_MAX_DELAY``, reset once a session has been
established; the Redis worker keeps the shared subscription core's timings instead). Every new
session is a new "connection" for the follower: the positions are announced again and the
follower catches up whatever was missed in between.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Collection, Mapping, Sequence

from replication.protocol.commands import Command, PositionCommand, RdataCommand, RdataRun
from replication.worker.cache_invalidation import DjangoCacheInvalidator
from replication.worker.catchup_client import CatchUpPage, fetch_catch_up_page
from replication.worker.follower import (
    Advanced,
    Decision,
    Deliver,
    DeliverRun,
    FetchCatchUp,
    Reset,
    StreamFollower,
    StreamKey,
)
from streams.registry import STREAMS

logger = logging.getLogger(__name__)

#: Reconnect back-off: first delay, doubling up to the cap (Synapse caps its Redis subscriber
#: at 5 s: a long back-off turns a blip into minutes of staleness).
RECONNECT_FIRST_DELAY = 0.5
RECONNECT_MAX_DELAY = 5.0
#: On stop, deliver what was already decided for at most this long.
DRAIN_TIMEOUT = 5.0

FactsCallback = Callable[[str, str, int, list], Awaitable[None] | None]


class _Lane:
    """One stream's ordered delivery: its decisions waiting, its consumer task, its thread.

    A deque and two events rather than an ``asyncio.Queue``: decisions arrive a read's worth
    at a time and the consumer takes all that are there without a wake-up per decision (the
    queue's put/get were a fifth of a worker's time per fact).
    """

    __slots__ = ("stream", "pending", "executor", "task", "wake", "idle")

    def __init__(self, stream: str, executor: ThreadPoolExecutor) -> None:
        self.stream = stream
        self.pending: deque[Decision] = deque()
        self.executor = executor
        self.task: asyncio.Task | None = None
        self.wake = asyncio.Event()
        #: set when nothing is pending and nothing is being applied
        self.idle = asyncio.Event()
        self.idle.set()


class BaseReplicationWorker:
    """Follows the replication streams for this process, over a transport a subclass provides.

    ``on_facts(stream, writer, token, rows)`` is called exactly once per fact, in each writer's
    order. A coroutine function is awaited on the event loop; a plain function runs on its
    stream's own thread (so it may block or use the Django ORM): calls for one stream never
    overlap, calls for different streams may run at the same time. If it raises,
    the error is logged and counted and the fact is not offered again (Synapse does the same).
    ``on_reset(stream, writer)`` (optional, same rules) runs when an in-memory stream's writer
    restarted. ``initial_tokens`` says where this process already is per (stream, writer);
    others start at 0, i.e. from the beginning of the stream.

    Catch-up requests for a writer go to ``instance_urls[writer]`` when the map names it (as
    Synapse's workers ask the writer itself, through its ``instance_map``), else to
    ``catchup_url``.

    Subclasses implement :meth:`_attempt` (one connection, from connect to loss; feed the
    commands it receives to :meth:`_dispatch`) and :meth:`_interrupt` (make it return soon).
    """

    #: Short name of the transport, for logs.
    transport = "?"

    def __init__(
        self,
        *,
        name: str,
        server_name: str,
        catchup_url: str,
        instance_urls: Mapping[str, str] | None = None,
        on_facts: FactsCallback | None = None,
        on_reset: Callable[[str, str], Any] | None = None,
        streams: Collection[str] | None = None,
        initial_tokens: Mapping[StreamKey, int] | None = None,
        apply_caches: bool = True,
        cache: Any = None,
        fetch_page: Callable[[str, str, int, int], CatchUpPage] | None = None,
        replication_secret: str = "",
        catchup_max_range: int | None = None,
        catchup_page_limit: int | None = None,
        reconnect_first_delay: float = RECONNECT_FIRST_DELAY,
        reconnect_max_delay: float = RECONNECT_MAX_DELAY,
        log_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not name or any(c in name for c in "\r\n"):
            raise ValueError(f"invalid worker name {name!r}")
        if streams is None:

            streams = list(STREAMS)
        self.name = name
        self.server_name = server_name
        self.catchup_url = catchup_url
        self.instance_urls = dict(instance_urls or {})
        self.follower = StreamFollower(name, streams, initial_tokens)
        self.invalidator = DjangoCacheInvalidator(cache) if apply_caches else None
        self._on_facts = on_facts
        #: awaited on the loop (the usual case, checked once: inspect's test costs ~1 us a call)
        self._on_facts_is_coro = on_facts is not None and inspect.iscoroutinefunction(on_facts)
        self._on_reset = on_reset
        self._fetch_page = fetch_page or (
            lambda s, w, f, u: fetch_catch_up_page(self.catchup_url_for(w), s, w, f, u,
                                                   secret=replication_secret,
                                                   max_range=catchup_max_range,
                                                   page_limit=catchup_page_limit))
        self._first_delay, self._max_delay = reconnect_first_delay, reconnect_max_delay
        self._log_interval = log_interval
        self._clock = clock
        self._positions: dict[StreamKey, int] = dict(initial_tokens or {})
        self._counters: Counter[str] = Counter()
        self._facts_by_stream: Counter[str] = Counter()
        self._lanes: dict[str, _Lane] = {}
        self._fetches: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._stopping = False
        self.connected = False

    # --- public API ------------------------------------------------------------------------

    def positions(self) -> dict[StreamKey, int]:
        """Per (stream, writer), the token up to which facts were handed to ``on_facts``."""
        return dict(self._positions)

    @property
    def counters(self) -> dict[str, Any]:
        """Progress counters: facts, rows, connections, catch-up requests and failures..."""
        return {**self._counters, "facts_by_stream": dict(self._facts_by_stream)}

    def catchup_url_for(self, writer: str) -> str:
        """The base URL of the catch-up endpoint that serves ``writer``'s facts."""
        return self.instance_urls.get(writer, self.catchup_url)

    def stop(self) -> None:
        """Ask :meth:`run` to finish (from any thread, or a signal handler)."""
        self._stopping = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            same_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            same_loop = False
        if same_loop:
            self._wake()
        else:
            loop.call_soon_threadsafe(self._wake)

    async def run(self) -> None:
        """Follow the streams until :meth:`stop`; reconnects on its own forever."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        progress = asyncio.create_task(self._log_progress())
        try:
            await self._connect_forever()
        finally:
            progress.cancel()
            for task in list(self._fetches):
                task.cancel()
            await asyncio.gather(progress, *self._fetches, return_exceptions=True)
            await self._drain_lanes()
            logger.info("replication worker %s (%s) stopped: %s", self.name, self.transport,
                        self._summary())

    # --- connection (shared) ---------------------------------------------------------------

    def _wake(self) -> None:
        assert self._stop_event is not None
        self._stop_event.set()
        self._interrupt()

    def _interrupt(self) -> None:
        """On stop: make the session in progress, if any, return soon."""

    async def _sleep(self, delay: float) -> None:
        """Sleep, but wake up at once on stop."""
        assert self._stop_event is not None
        try:
            await asyncio.wait_for(self._stop_event.wait(), delay)
        except TimeoutError:
            pass

    async def _connect_forever(self) -> None:
        delay = self._first_delay
        while not self._stopping:
            self._counters["connection_attempts"] += 1
            if await self._attempt(delay):
                delay = self._first_delay
            if self._stopping:
                break
            await self._sleep(delay)
            delay = min(delay * 2, self._max_delay)

    async def _attempt(self, delay: float) -> bool:
        """One connection: connect, follow until it is lost, clean up (always calling
        ``follower.connection_lost()``). Returns whether a session was established (which
        resets the back-off); ``delay`` is the back-off before the next attempt, for logs.
        Errors are logged here, never raised."""
        raise NotImplementedError

    def _dispatch_many(self, cmds: Sequence[Command | RdataRun]) -> None:
        """Feed received commands to the follower, in order (RDATA, runs of RDATA and
        POSITION; others ignored), and run its decisions."""
        follower = self.follower
        decisions: list[Decision] = []
        rdata = positions = 0
        for cmd in cmds:
            kind = type(cmd)
            if kind is RdataRun:
                rdata += len(cmd.entries)
                decisions += follower.on_rdata_run(cmd.stream_name, cmd.instance_name, cmd.entries)
            elif kind is RdataCommand:
                rdata += 1
                decisions += follower.on_rdata(cmd)
            elif kind is PositionCommand:
                positions += 1
                decisions += follower.on_position(cmd)
            else:
                logger.debug("replication command not used by a worker: %r", cmd)
        if rdata:
            self._counters["rdata"] += rdata
        if positions:
            self._counters["position"] += positions
        if decisions:
            self._execute(decisions)

    # --- decisions -------------------------------------------------------------------------

    def _execute(self, decisions: list[Decision]) -> None:
        lanes = self._lanes
        touched: set[_Lane] = set()
        for decision in decisions:
            if type(decision) is FetchCatchUp:
                task = asyncio.create_task(self._catch_up(decision))
                self._fetches.add(task)
                task.add_done_callback(self._fetches.discard)
            else:
                lane = lanes.get(decision.stream) or self._lane(decision.stream)
                lane.pending.append(decision)
                touched.add(lane)
        for lane in touched:
            lane.idle.clear()
            lane.wake.set()

    async def _catch_up(self, request: FetchCatchUp) -> None:
        if request.delay:
            await asyncio.sleep(request.delay)
        self._counters["catch_up_requests"] += 1
        try:
            page = await asyncio.to_thread(self._fetch_page, request.stream, request.writer,
                                           request.from_token, request.upto_token)
        except Exception as e:
            self._counters["catch_up_failures"] += 1
            logger.warning("catch-up of %s/%s (%s, %s] failed (attempt %d): %s", request.stream,
                           request.writer, request.from_token, request.upto_token,
                           request.attempt + 1, e)
            decisions = self.follower.catch_up_failed(request.stream, request.writer)
        else:
            self._counters["catch_up_updates"] += len(page.updates)
            decisions = self.follower.on_catch_up_page(
                request.stream, request.writer, page.updates, page.upto_token, page.limited)
        self._execute(decisions)

    def _lane(self, stream: str) -> _Lane:
        lane = self._lanes.get(stream)
        if lane is None:
            lane = self._lanes[stream] = _Lane(stream, ThreadPoolExecutor(1, thread_name_prefix=f"repl-{stream}"))
            lane.task = asyncio.create_task(self._run_lane(lane))
        return lane

    async def _run_lane(self, lane: _Lane) -> None:
        """Apply one stream's decisions strictly in order."""
        pending = lane.pending
        positions = self._positions
        while True:
            await lane.wake.wait()
            lane.wake.clear()
            delivered = rows_delivered = 0
            try:
                while pending:
                    decision = pending.popleft()
                    kind = type(decision)
                    if (kind is DeliverRun or kind is Deliver) and self._on_facts_is_coro \
                            and decision.stream != "caches":
                        # The usual case: a run of one writer's facts (or one fact), _apply's
                        # work inline for each -- the callback awaited, no coroutine of ours,
                        # counters added once per wake-up.
                        facts = (decision.facts if kind is DeliverRun
                                 else ((decision.token, list(decision.rows)),))
                        stream, writer, on_facts = decision.stream, decision.writer, self._on_facts
                        key = (stream, writer)
                        for token, rows in facts:
                            try:
                                await on_facts(stream, writer, token, rows)
                            except Exception:
                                self._counters["callback_errors"] += 1
                                logger.exception("applying %s/%s %s failed; moving on", stream, writer, token)
                            positions[key] = token
                            delivered += 1
                            rows_delivered += len(rows)
                        continue
                    if kind is DeliverRun:
                        # the rare kinds of delivery: one fact at a time, as _apply does it
                        pending.extendleft(reversed(decision.delivers()))
                        continue
                    try:
                        await self._apply(lane, decision)
                    except Exception:
                        self._counters["callback_errors"] += 1
                        logger.exception("applying %r failed; moving on", decision)
            finally:
                if delivered:
                    self._counters["facts"] += delivered
                    self._counters["rows"] += rows_delivered
                    self._facts_by_stream[lane.stream] += delivered
            lane.idle.set()

    async def _apply(self, lane: _Lane, decision: Decision) -> None:
        key = (decision.stream, decision.writer)
        if type(decision) is Deliver:
            rows = list(decision.rows)
            try:
                if decision.stream == "caches" and self.invalidator is not None:
                    # Invalidate before anyone can see the new position (docs/replication.md, "The worker").
                    await self._call(lane, self.invalidator.apply, rows)
                if self._on_facts_is_coro:
                    await self._on_facts(decision.stream, decision.writer, decision.token, rows)
                elif self._on_facts is not None:
                    await self._call(lane, self._on_facts, decision.stream, decision.writer,
                                     decision.token, rows)
            finally:
                self._positions[key] = decision.token
                self._counters["facts"] += 1
                self._counters["rows"] += len(rows)
                self._facts_by_stream[decision.stream] += 1
        elif isinstance(decision, Advanced):
            self._positions[key] = decision.token
        elif isinstance(decision, Reset):
            self._positions[key] = 0
            self._counters["resets"] += 1
            if self._on_reset is not None:
                await self._call(lane, self._on_reset, decision.stream, decision.writer)

    @staticmethod
    async def _call(lane: _Lane, func: Callable[..., Any], *args: Any) -> None:
        if inspect.iscoroutinefunction(func):
            await func(*args)
            return
        result = await asyncio.get_running_loop().run_in_executor(lane.executor, func, *args)
        if inspect.isawaitable(result):
            await result

    async def _drain_lanes(self) -> None:
        lanes = list(self._lanes.values())
        try:
            await asyncio.wait_for(asyncio.gather(*(lane.idle.wait() for lane in lanes)),
                                   DRAIN_TIMEOUT)
        except TimeoutError:
            logger.warning("stopping with facts still undelivered")
        for lane in lanes:
            lane.task.cancel()
        await asyncio.gather(*(lane.task for lane in lanes), return_exceptions=True)
        for lane in lanes:
            lane.executor.shutdown(wait=False)

    # --- progress --------------------------------------------------------------------------

    def _summary(self) -> str:
        per_stream = ", ".join(f"{s} {n}" for s, n in sorted(self._facts_by_stream.items()))
        return (f"{self._counters['facts']} facts ({per_stream or 'none'}), "
                f"{self._counters['connections']} connections, "
                f"{self._counters['catch_up_requests']} catch-up requests "
                f"({self._counters['catch_up_failures']} failed, {self._counters['catch_up_updates']} updates)")

    async def _log_progress(self) -> None:
        seen: Counter[str] = Counter()
        while True:
            await asyncio.sleep(self._log_interval)
            new = self._facts_by_stream - seen
            if new:
                seen = Counter(self._facts_by_stream)
                logger.info("replication %s: +%s in %.0fs; %s", self.name,
                            ", ".join(f"{s} {n}" for s, n in sorted(new.items())),
                            self._log_interval, "connected" if self.connected else "disconnected")
