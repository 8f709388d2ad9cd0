"""The asyncio replication worker: a thin adapter around StreamFollower (docs/replication.md).

Two transports, one worker. The follower, the lanes, the catch-up and the caches live in
:class:`BaseReplicationWorker`; a subclass only runs the *session* (one connection, until it
drops) and feeds RDATA and POSITION to the follower:

* :class:`ReplicationWorker` (TCP) connects to a replication endpoint (spec §4.2: ``NAME``,
  ``PING``, ``REPLICATE``, then checks ``SERVER``) and keeps the connection alive (§4.3: PING
  after 5 s without sending, give up 25 s after the peer's last command once it has sent a
  PING).
* :class:`RedisReplicationWorker` follows the cluster through Redis pub/sub directly, as
  Synapse workers do (spec §5): SUBSCRIBE to the channel named exactly the server name, wait
  for the confirmation, then PUBLISH ``REPLICATE `` on a second connection (§5.3; the other
  order could miss the POSITION answers). Each message is one command line: malformed ones
  are logged and dropped, there are no direction checks (§5.4), RDATA/POSITION of our own
  instance name are echoes and ignored. The subscription is ``redis_session.py``'s, shared
  with the writers' bridge: PINGed after 5 s of silence and dropped after 15 s, so a dead
  socket is noticed (Synapse issue #9010).

Both feed the follower the same way, and run the decisions it returns:

* ``Deliver``/``Advanced``/``Reset`` go to the stream's *lane*: one asyncio queue, one
  consumer task and one thread (for blocking work) per stream, which applies ``caches`` rows
  to the Django cache, then calls ``on_facts(stream, writer, token, rows)``. A slow callback
  only holds up its own stream; the reading loop, and so PING handling, never waits for it.
* ``FetchCatchUp`` becomes a task that GETs one page of the catch-up endpoint (§10.2; stdlib
  ``urllib`` in a thread) -- the writer's own (``instance_urls``) or ``catchup_url``, with a
  fresh transaction ID each time, as Synapse's form requires -- and hands the result back to
  the follower, which answers with the rows to deliver and the next page, the end, or a retry
  after a back-off delay.

The follower guarantees the order of decisions (one catch-up in flight per stream, that
stream's commands parked behind it); each lane keeps that order to the callback. A lost
connection (a TCP connection, or the Redis subscription) is retried forever with exponential
back-off (TCP: 0.5 s doubling; Redis: redis_session.py's 0.25 s doubling with jitter; both
capped at 5 s and reset once a session has been established); every
new session is a new "connection" for the follower, the positions are announced again (the
TCP server answers REPLICATE; on Redis, writers answer our REPLICATE and announce their own
positions when they reconnect) and the follower catches up whatever was missed in between.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import logging
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Collection, Mapping, Sequence

from redis.asyncio.connection import parse_url as parse_redis_url

from streams.replication.http.auth import bearer_header
from streams.replication.protocol.commands import (
    Command,
    ErrorCommand,
    NameCommand,
    PingCommand,
    PositionCommand,
    RdataCommand,
    RemoteProtocolError,
    ReplicateCommand,
    ServerCommand,
    parse_line,
)
from streams.replication.protocol.connection import CLOSED, ReplicationConnection
from streams.replication.protocol.redis_session import RedisSubscription, SubscriptionPolicy
from streams.replication.protocol.resp import RespConnection, RespError, parse_messages
from streams.replication.publish.redis_bridge import redis_channel
from streams.replication.worker.follower import Advanced, Decision, Deliver, FetchCatchUp, Reset, StreamFollower, StreamKey
from synapse_repl.redaction import redact_url

logger = logging.getLogger(__name__)

#: How often the reading loop wakes up with nothing to read, to send PINGs and check the
#: timeout. Well under PING_INTERVAL so a PING is never more than this late.
TICK = 0.5
#: Reconnect back-off: first delay, doubling up to the cap (Synapse caps its Redis subscriber
#: at 5 s, lesson §15 #2: long back-offs turn a blip into minutes of staleness).
RECONNECT_FIRST_DELAY = 0.5
RECONNECT_MAX_DELAY = 5.0
CONNECT_TIMEOUT = 10.0
#: One catch-up page must come back within this many seconds, or the request is retried.
HTTP_TIMEOUT = 10.0
#: On stop, deliver what was already decided for at most this long.
DRAIN_TIMEOUT = 5.0
#: What we publish on (re)subscribing: the current generation's REPLICATE, trailing space
#: included (spec §5.3 step 3). The Redis subscription's timings are redis_session.py's.
REDIS_REPLICATE = ReplicateCommand().to_line()

FactsCallback = Callable[[str, str, int, list], Awaitable[None] | None]


# --- the catch-up endpoint -----------------------------------------------------------------


@dataclass(frozen=True)
class CatchUpPage:
    """One answer of ``get_repl_stream_updates``: ``[token, row]`` pairs, sorted."""

    updates: list[list[Any]]
    upto_token: int
    limited: bool


class CatchUpError(Exception):
    """A catch-up page could not be fetched or read; the follower retries it."""


def new_txn_id() -> str:
    """A transaction ID for one catch-up request: random, never reused. The server keeps its
    answer under the ID for 30 minutes (Synapse does, and so does our endpoint): a reused ID
    would get that old answer back, and stale tokens would pass for "caught up"."""
    return secrets.token_urlsafe(12)


def fetch_catch_up_page(base_url: str, stream: str, writer: str, from_token: int,
                        upto_token: int, *, timeout: float = HTTP_TIMEOUT, secret: str = "",
                        max_range: int | None = None, page_limit: int | None = None,
                        ssl_context: Any = None,
                        txn_id: Callable[[], str] = new_txn_id) -> CatchUpPage:
    """GET one page of ``(from_token, upto_token]`` of ``writer`` on ``stream`` (blocking),
    from ``<base_url>/_synapse/replication/get_repl_stream_updates/<stream>/<txn_id>``, with a
    fresh ``txn_id()`` for every request (retries included).

    ``secret``: sent as ``Authorization: Bearer`` (``REPLICATION_SECRET``). ``max_range``: the
    server's ``REPLICATION_CATCHUP_MAX_RANGE``; a longer range is asked for in pieces (the
    page says ``limited`` until the last piece, so the follower keeps asking).
    ``page_limit``: rows per page to ask for (the server's ``REPLICATION_CATCHUP_MAX_LIMIT``;
    ``None``: the server's default, Synapse's 100). A worker far behind catches up in 10x
    fewer requests with 1,000; a server that refuses the limit is asked again without it.
    """
    asked_upto = upto_token
    if max_range is not None and upto_token - from_token > max_range:
        upto_token = from_token + max_range
    params: dict[str, Any] = {"instance_name": writer, "from_token": from_token, "upto_token": upto_token}
    if page_limit is not None:
        params["limit"] = page_limit
    query = urllib.parse.urlencode(params)
    url = (f"{base_url.rstrip('/')}/_synapse/replication/get_repl_stream_updates/"
           f"{urllib.parse.quote(stream, safe='')}/{txn_id()}?{query}")
    request = urllib.request.Request(url, headers=bearer_header(secret))
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=ssl_context) as response:
            body = json.loads(response.read())
        page = CatchUpPage(list(body["updates"]), int(body["upto_token"]), bool(body["limited"]))
    except urllib.error.HTTPError as e:
        body = e.read()[:200]
        if e.code == 400 and page_limit is not None and b"limit" in body:
            # The server caps pages lower than we asked (REPLICATION_CATCHUP_MAX_LIMIT differs).
            logger.warning("catch-up: %s refused limit=%d (%r); asking without it", base_url, page_limit, body)
            return fetch_catch_up_page(base_url, stream, writer, from_token, asked_upto, timeout=timeout,
                                       secret=secret, max_range=max_range, ssl_context=ssl_context,
                                       txn_id=txn_id)
        raise CatchUpError(f"GET {url}: HTTP {e.code} {body!r}") from e
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CatchUpError(f"GET {url}: {e!r}") from e
    if upto_token < asked_upto and not page.limited:
        return CatchUpPage(page.updates, upto_token, True)
    return page


def parse_instance_map(text: str) -> dict[str, str]:
    """``"w1=http://10.0.0.1:8000,w2=http://10.0.0.2:8000"`` -> writer name -> catch-up base
    URL (``REPLICATION_INSTANCE_MAP``, ``replication_worker --instance-url``). Raises
    ``ValueError`` naming the part it cannot read."""
    result: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, url = (x.strip() for x in part.partition("="))
        scheme = urllib.parse.urlsplit(url).scheme if sep else ""
        if not name or scheme not in ("http", "https") or not urllib.parse.urlsplit(url).netloc:
            raise ValueError(f"cannot read {part!r}: expected writer=http://host:port")
        if name in result:
            raise ValueError(f"writer {name!r} is given twice")
        result[name] = url
    return result


# --- the caches stream -----------------------------------------------------------------------


class DjangoCacheInvalidator:
    """Applies ``caches`` stream rows ``[cache_func, keys, invalidation_ts]`` to a Django cache.

    Key scheme (writers and readers of cached values must use it, via :meth:`get`,
    :meth:`set` or :meth:`entry_key`):

    * the entry of cached function ``F`` for key components ``(k1, ..., kn)`` lives under the
      Django cache key ``"F:k1:...:kn"``, each component written as text (``%`` and ``:``
      inside it escaped as ``%25`` and ``%3A``, so ``("a:b", "c")`` and ``("a", "b:c")`` never
      collide; non-strings as compact JSON), stored with Django's cache ``version`` set to
      ``F``'s current *generation*;
    * ``F``'s generation lives under ``"F#generation"`` (never expires). It starts at a unique
      value (``time.time_ns()``) when missing and is incremented to drop all of ``F`` at once.

    A row with keys deletes that one entry; a row with ``keys = null`` bumps the generation, so
    every entry written before is never read again (the backend expires or evicts it). If the
    generation key itself is evicted, the next one is a fresh unique value: eviction can only
    lose entries, never revive stale ones. Synapse's "magic" names (``cs_cache_fake`` ...)
    are treated like any other function name here. ``cache=None`` means
    ``django.core.cache.caches["default"]``, looked up on each use (it is per thread).
    """

    def __init__(self, cache: Any = None) -> None:
        self._cache = cache

    @property
    def cache(self) -> Any:
        if self._cache is not None:
            return self._cache
        from django.core.cache import caches

        return caches["default"]

    @staticmethod
    def _component(value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        return text.replace("%", "%25").replace(":", "%3A")

    def entry_key(self, cache_func: str, keys: Sequence[Any]) -> tuple[str, int]:
        """The Django cache key and version of ``cache_func``'s entry for ``keys``."""
        return ":".join([cache_func, *map(self._component, keys)]), self.generation(cache_func)

    def generation(self, cache_func: str) -> int:
        cache, key = self.cache, f"{cache_func}#generation"
        value = cache.get(key)
        if value is None:
            cache.add(key, time.time_ns(), timeout=None)
            value = cache.get(key)
        return value

    def get(self, cache_func: str, keys: Sequence[Any], default: Any = None) -> Any:
        key, version = self.entry_key(cache_func, keys)
        return self.cache.get(key, default, version=version)

    def set(self, cache_func: str, keys: Sequence[Any], value: Any, timeout: Any = None) -> None:
        key, version = self.entry_key(cache_func, keys)
        self.cache.set(key, value, timeout=timeout, version=version)

    def invalidate(self, cache_func: str, keys: Sequence[Any] | None) -> None:
        if keys is None:
            cache, key = self.cache, f"{cache_func}#generation"
            try:
                cache.incr(key)
            except ValueError:  # missing: any fresh value is a new generation
                cache.add(key, time.time_ns(), timeout=None)
            return
        key, version = self.entry_key(cache_func, keys)
        self.cache.delete(key, version=version)

    def apply(self, rows: Sequence[Any]) -> None:
        for row in rows:
            if (not isinstance(row, list) or len(row) != 3 or not isinstance(row[0], str)
                    or not (row[1] is None or isinstance(row[1], list))):
                logger.warning("caches row with an unexpected shape, ignored: %r", row)
                continue
            self.invalidate(row[0], row[1])


# --- the worker ------------------------------------------------------------------------------


class _WrongRemote(Exception):
    pass


class _Lane:
    """One stream's ordered delivery: its decisions waiting, its consumer task, its thread.

    A deque and two events rather than an ``asyncio.Queue``: decisions arrive a read's worth
    at a time and the consumer takes all that are there without a wake-up per decision (the
    queue's put/get were a fifth of a worker's time per fact).
    """

    __slots__ = ("pending", "executor", "task", "wake", "idle")

    def __init__(self, executor: ThreadPoolExecutor) -> None:
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
            from streams.registry import STREAMS

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

    def _dispatch_many(self, cmds: Sequence[Command]) -> None:
        """Feed received commands to the follower, in order (RDATA and POSITION; others
        ignored), and run its decisions."""
        follower = self.follower
        decisions: list[Decision] = []
        rdata = positions = 0
        for cmd in cmds:
            kind = type(cmd)
            if kind is RdataCommand:
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
            decisions = self.follower.on_catch_up_page(
                request.stream, request.writer, page.updates, page.upto_token, page.limited)
        self._execute(decisions)

    def _lane(self, stream: str) -> _Lane:
        lane = self._lanes.get(stream)
        if lane is None:
            lane = self._lanes[stream] = _Lane(ThreadPoolExecutor(1, thread_name_prefix=f"repl-{stream}"))
            lane.task = asyncio.create_task(self._run_lane(lane))
        return lane

    async def _run_lane(self, lane: _Lane) -> None:
        """Apply one stream's decisions strictly in order."""
        pending = lane.pending
        while True:
            await lane.wake.wait()
            lane.wake.clear()
            while pending:
                decision = pending.popleft()
                try:
                    await self._apply(lane, decision)
                except Exception:
                    self._counters["callback_errors"] += 1
                    logger.exception("applying %r failed; moving on", decision)
            lane.idle.set()

    async def _apply(self, lane: _Lane, decision: Decision) -> None:
        key = (decision.stream, decision.writer)
        if type(decision) is Deliver:
            rows = list(decision.rows)
            try:
                if decision.stream == "caches" and self.invalidator is not None:
                    # Invalidate before anyone can see the new position (spec §11).
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
                f"({self._counters['catch_up_failures']} failed)")

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


# --- TCP ---------------------------------------------------------------------------------------


class ReplicationWorker(BaseReplicationWorker):
    """Follows the streams of one replication endpoint (``runreplication``) over TCP."""

    transport = "tcp"

    def __init__(self, *, host: str, port: int, ssl: Any = None, **kwargs: Any) -> None:
        """``ssl``: an ``ssl.SSLContext`` to speak TLS, verifying the server (``tls.py``)."""
        super().__init__(**kwargs)
        self.host, self.port = host, port
        self.ssl = ssl
        self._transport: asyncio.StreamWriter | None = None

    def _interrupt(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def _attempt(self, delay: float) -> bool:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl), CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as e:
            logger.warning("cannot connect to replication at %s:%s: %s; retrying in %.1fs",
                           self.host, self.port, e, delay)
            return False
        self._transport = writer
        accepted = False
        try:
            accepted = await self._session(reader, writer)
        except _WrongRemote:
            pass
        except (OSError, ConnectionError) as e:
            logger.warning("replication connection failed: %s", e)
        finally:
            self._transport = None
            self.connected = False
            self.follower.connection_lost()
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ConnectionError):
                pass
        if not self._stopping:
            logger.info("replication connection to %s:%s closed; reconnecting in %.1fs",
                        self.host, self.port, self._first_delay if accepted else delay)
        return accepted

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One connection, until it closes. Returns whether the server was accepted."""
        now = self._clock()
        conn = ReplicationConnection("client", now=now)
        writer.write(conn.send_many(
            [NameCommand(self.name), PingCommand(self._ping_body()), ReplicateCommand()], now))
        accepted = False
        while not self._stopping:
            try:
                # A read's worth of commands at once (the hot path), in order.
                events = conn.next_events(now)
                if events:
                    accepted = await self._take(conn, writer, events, accepted)
                    continue
                event = conn.next_event(now)  # no complete line left: NEED_DATA or CLOSED
            except RemoteProtocolError as e:
                logger.error("replication protocol error from server: %s", e.error_text)
                await self._send_error(conn, writer, e.error_text)
                return accepted
            if event is CLOSED:
                return accepted
            try:
                conn.receive_data(await asyncio.wait_for(reader.read(65536), TICK))
            except TimeoutError:
                pass
            now = self._clock()
            if conn.timed_out(now):
                logger.warning("replication server sent nothing for too long; reconnecting")
                self._counters["ping_timeouts"] += 1
                await self._send_error(conn, writer, "ping timeout")
                return accepted
            if conn.ping_due(now):
                writer.write(conn.send(PingCommand(self._ping_body()), now))
        return accepted

    async def _take(self, conn: ReplicationConnection, writer: asyncio.StreamWriter,
                    events: list[Command], accepted: bool) -> bool:
        """Act on received commands, in order; returns whether the server is accepted.

        Runs of commands other than SERVER, ERROR and PING go to the follower together
        (:meth:`_dispatch_many`).
        """
        run: list[Command] = []
        for event in events:
            kind = type(event)
            if kind is not ServerCommand and kind is not ErrorCommand and kind is not PingCommand:
                run.append(event)
                continue
            if run:
                self._dispatch_many(run)
                run = []
            if kind is ServerCommand:
                if event.data != self.server_name:
                    logger.error("replication server is %r, expected %r: Wrong remote",
                                 event.data, self.server_name)
                    self._counters["wrong_remote"] += 1
                    await self._send_error(conn, writer, "Wrong remote")
                    raise _WrongRemote(event.data)
                accepted = self.connected = True
                self._counters["connections"] += 1
                logger.info("replication connected to %s at %s:%s as %s", event.data,
                            self.host, self.port, self.name)
            elif kind is ErrorCommand:
                logger.warning("replication server reported an error: %s", event.data)
        if run:
            self._dispatch_many(run)
        return accepted

    async def _send_error(self, conn: ReplicationConnection, writer: asyncio.StreamWriter,
                          text: str) -> None:
        writer.write(conn.send(ErrorCommand(text), self._clock()))
        try:
            await asyncio.wait_for(writer.drain(), 1.0)
        except (OSError, ConnectionError, TimeoutError):
            pass

    @staticmethod
    def _ping_body() -> str:
        return str(int(time.time() * 1000))


# --- Redis -------------------------------------------------------------------------------------


class RedisReplicationWorker(BaseReplicationWorker):
    """Follows the cluster through Redis pub/sub (spec §5), as Synapse workers do.

    ``redis_url`` is a ``redis://``, ``rediss://`` or ``unix://`` URL (its database number
    does not matter: pub/sub channels are server-wide). The channel is ``server_name``
    exactly. The subscription is :class:`~.redis_session.RedisSubscription` (the one the
    writers' bridge keeps too): its own connection, with a second one to publish on (Redis
    allows nothing but (UN)SUBSCRIBE and PING on a subscribed connection), both through
    :class:`~.resp.RespConnection`, not redis-py's ``PubSub``: PubSub silently reconnects and
    resubscribes inside a read, which would hide from us (and from the follower) that
    messages were lost, and would not publish REPLICATE again; and its pure-Python parser
    costs several times what the rest of the worker does per line.

    Session, per §5.3: SUBSCRIBE, wait for the confirmation, then PUBLISH ``REPLICATE ``
    (awaiting its reply) and read messages until the connection is lost, the subscriber has
    been silent for ``ping_timeout`` seconds (it is PINGed every ``ping_interval`` while
    silent), or :meth:`stop`. :meth:`publish` sends a command of the worker's own
    (``REMOTE_SERVER_UP``, ``LOCK_RELEASED``, ``USER_IP``...) to the cluster.
    """

    transport = "redis"

    def __init__(
        self,
        *,
        redis_url: str,
        ping_interval: float | None = None,
        ping_timeout: float | None = None,
        reply_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        defaults = SubscriptionPolicy()
        kwargs.setdefault("reconnect_first_delay", defaults.first_delay)
        kwargs.setdefault("reconnect_max_delay", defaults.max_delay)
        super().__init__(**kwargs)
        if not self.server_name or any(c in self.server_name for c in "\r\n"):
            raise ValueError(f"invalid server name (Redis channel) {self.server_name!r}")
        self.redis_url = redis_url
        self.channel = self.server_name
        parse_redis_url(redis_url)  # ValueError for a bad URL
        self._reply_timeout = reply_timeout or defaults.confirm_timeout
        policy = SubscriptionPolicy(
            ping_interval=ping_interval or defaults.ping_interval,
            silence_timeout=ping_timeout or defaults.silence_timeout,
            confirm_timeout=self._reply_timeout,
            first_delay=self._first_delay, max_delay=self._max_delay)
        self.subscription = RedisSubscription(
            redis_url, [self.channel.encode()], on_subscribed=self._on_subscribed,
            on_chunk=self._on_chunk, on_lost=self._on_lost, policy=policy,
            name=f"Redis replication ({self.name})", clock=self._clock, counters=self._counters)
        self._publisher: RespConnection | None = None
        self._publish_lock = asyncio.Lock()
        self._buf = b""

    def _interrupt(self) -> None:
        self.subscription.stop()

    async def _connect_forever(self) -> None:
        if self._stopping:
            return
        try:
            await self.subscription.run()
        finally:
            if self._publisher is not None:
                await self._publisher.close()
                self._publisher = None

    async def publish(self, cmd: Command) -> int:
        """PUBLISH one command of ours on its Synapse channel; the number of subscribers that
        got it (raises :class:`~.resp.RespError` or TimeoutError if Redis did not take it)."""
        line = cmd.to_line().encode()
        async with self._publish_lock:
            try:
                if self._publisher is None:
                    self._publisher = await RespConnection.open(self.redis_url, self._reply_timeout)
                return await self._publisher.command("PUBLISH", redis_channel(self.channel, line), line,
                                                     timeout=self._reply_timeout)
            except (RespError, OSError, TimeoutError):
                if self._publisher is not None:
                    await self._publisher.close()
                    self._publisher = None
                raise

    async def _on_subscribed(self) -> None:
        # From here on, everything published on the channel reaches us: a new connection
        # for the follower (the last one ended with connection_lost()). Then REPLICATE, and
        # wait until Redis took it.
        self._buf = b""
        async with self._publish_lock:
            if self._publisher is not None:  # of an earlier subscription: maybe a dead socket
                await self._publisher.close()
                self._publisher = None
        self.connected = True
        self._counters["connections"] += 1
        try:
            receivers = await self.publish(ReplicateCommand())
        except TimeoutError:
            raise TimeoutError(f"PUBLISH not answered within {self._reply_timeout}s") from None
        self._counters["replicate_sent"] += 1
        logger.info("replication subscribed to %r at %s as %s; REPLICATE reached %s "
                    "subscriber(s)", self.channel, redact_url(self.redis_url), self.name, receivers)

    def _on_lost(self, reason: str | None) -> None:
        self.connected = False
        self.follower.connection_lost()

    def _on_chunk(self, chunk: bytes) -> None:
        buf = self._buf + chunk if self._buf else chunk
        replies, end = parse_messages(buf)
        self._buf = buf[end:]
        cmds: list[Command] = []
        for reply in replies:
            if type(reply) is bytes:
                cmd = self._on_message(reply)
                if cmd is not None:
                    cmds.append(cmd)
            elif not (reply and reply[0] == b"pong"):
                logger.debug("Redis reply ignored: %r", reply)
        if cmds:
            # A read's worth of messages to the follower at once (the hot path).
            self._dispatch_many(cmds)

    def _on_message(self, data: bytes) -> Command | None:
        """One pub/sub message: one command line, without newline (spec §5.4). Returns the
        command for the follower, if it is one for it."""
        self._counters["messages"] += 1
        try:
            cmd = parse_line(data.decode("utf-8"))
        except (UnicodeDecodeError, RemoteProtocolError) as e:
            self._counters["malformed"] += 1
            text = e.error_text if isinstance(e, RemoteProtocolError) else repr(e)
            logger.warning("dropping malformed replication message on %r: %s (%r)",
                           self.channel, text, data[:200])
            return None
        kind = type(cmd)
        if kind is RdataCommand or kind is PositionCommand:
            if cmd.instance_name == self.name:
                self._counters["own_echoes"] += 1  # what we published, echoed back (§3.17)
                return None
            return cmd
        if isinstance(cmd, ReplicateCommand):
            # Someone (re)subscribed, maybe us: the writers answer it; a worker sources
            # no stream, so it has no position to announce.
            self._counters["replicate_seen"] += 1
            return None
        return cmd
