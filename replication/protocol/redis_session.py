"""One Redis subscription kept alive: the part the writer-side bridge
(``publish/redis_bridge.py``) and the Redis worker (``worker/redis_worker.py``) share (docs/replication.md).

Its life, for both: connect -> ``SUBSCRIBE`` the channels -> wait for every confirmation ->
the owner's ``on_subscribed`` (the worker publishes ``REPLICATE``, a writer announces its
positions) -> read; ``PING`` when the connection has been silent for ``ping_interval`` and
again every ``ping_interval`` while it stays silent; give it up after ``silence_timeout``
without a byte -> back off -> again. Every lost connection is a new subscription (never a
silent resubscription behind the owner's back, which would hide lost messages).

The decisions (when to ping, when to give up, how long to back off) are
:class:`SubscriptionMachine`, pure, with the clock and the randomness passed in, so they are
tested in process with a fake clock; :class:`RedisSubscription` is the asyncio adapter.

The constants, and why (Synapse's own, from its Redis factories: a PING every 30 s, a reply
timeout of 30 s, a reconnect back-off of Twisted's ``ReconnectingClientFactory`` -- 1 s
growing by e, capped at 5 s, with ~12 % jitter):

* ``PING_INTERVAL`` 5 s, ``SILENCE_TIMEOUT`` 15 s: shorter than Synapse's 30 s. A subscriber
  whose socket died without a FIN (Synapse issue #9010) loses every line until it notices,
  and a PING on a silent connection costs nothing; three missed intervals before giving up
  keep a slow Redis from being taken for a dead one. A busy channel is never pinged (its
  messages prove it alive).
* ``CONFIRM_TIMEOUT`` 10 s for connecting, the ``SUBSCRIBE`` confirmations and the owner's
  first publications: a Redis that accepts connections but does not answer is given up.
* Back-off: ``FIRST_DELAY`` 0.25 s doubling to ``MAX_DELAY`` 5 s (Synapse's cap: a long
  back-off turns a blip into minutes of staleness), each delay drawn within +-``JITTER``
  (10 %, Twisted's is 12 %) so that the endpoints, writers and workers of a cluster do not
  all reconnect in the same instant after a Redis restart. Synapse's first delay is 1 s; ours
  is shorter because a restarted Redis is usually back at once and every second away is a
  second of replication stalled. The back-off restarts from ``FIRST_DELAY`` only once the
  owner says the subscription is *established* (its ``on_subscribed`` succeeded): a Redis that
  confirms but refuses the PUBLISH that follows (an ACL) is not retried at full speed.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

from common.url_redaction import redact_url
from replication.protocol.resp import READ_SIZE, RespConnection, RespError, pack_command

logger = logging.getLogger(__name__)

PING_INTERVAL = 5.0
SILENCE_TIMEOUT = 15.0
CONFIRM_TIMEOUT = 10.0
FIRST_DELAY = 0.25
MAX_DELAY = 5.0
JITTER = 0.1
#: The reading loop wakes at least this often, so a stop or a due PING is never late.
TICK = 0.5


@dataclass(frozen=True)
class SubscriptionPolicy:
    """The timings of one subscription (the module's constants; tests shorten them)."""

    ping_interval: float = PING_INTERVAL
    silence_timeout: float = SILENCE_TIMEOUT
    confirm_timeout: float = CONFIRM_TIMEOUT
    first_delay: float = FIRST_DELAY
    max_delay: float = MAX_DELAY
    jitter: float = JITTER


class Phase(enum.Enum):
    IDLE = "idle"  #: not started, or backing off
    CONFIRMING = "confirming"  #: connecting, SUBSCRIBE sent, confirmations awaited
    LIVE = "live"  #: subscribed: reading, pinging when silent


class Due(enum.Enum):
    """What :meth:`SubscriptionMachine.poll` asks the adapter to do now."""

    NOTHING = "nothing"
    PING = "ping"
    GIVE_UP = "give up"


class SubscriptionMachine:
    """The decisions of one subscription, for a ``now`` the caller passes (seconds, monotonic).

    Events: :meth:`attempt` (connecting: :meth:`confirm_time_left` bounds the wait for the
    confirmations), :meth:`confirmed` (every SUBSCRIBE confirmed),
    :meth:`established` (the owner's first publications went out: the back-off resets),
    :meth:`heard` (any byte arrived), :meth:`pinged`, :meth:`lost` (returns the back-off).
    :meth:`poll` says whether a PING is due or the connection must be given up, and
    :meth:`wake_in` how long the adapter may wait for data before polling again.
    """

    def __init__(self, policy: SubscriptionPolicy = SubscriptionPolicy(), *,
                 rng: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self._rng = rng
        self.phase = Phase.IDLE
        self._next_delay = policy.first_delay
        self._deadline = 0.0  # CONFIRMING: give up at
        self._last_heard = 0.0
        self._last_ping = 0.0
        self.give_up_reason = ""

    def attempt(self, now: float) -> None:
        self.phase = Phase.CONFIRMING
        self._deadline = now + self.policy.confirm_timeout

    def confirm_time_left(self, now: float) -> float:
        """CONFIRMING: how long the confirmations may still take (never 0: a last look)."""
        return max(0.001, self._deadline - now)

    def confirmed(self, now: float) -> None:
        self.phase = Phase.LIVE
        self._last_heard = self._last_ping = now

    def established(self) -> None:
        self._next_delay = self.policy.first_delay

    def heard(self, now: float) -> None:
        self._last_heard = now

    def pinged(self, now: float) -> None:
        self._last_ping = now

    def poll(self, now: float) -> Due:
        """LIVE: is a PING due, or must the connection be given up?"""
        if self.phase is not Phase.LIVE:
            return Due.NOTHING
        silent = now - self._last_heard
        if silent >= self.policy.silence_timeout:
            self.give_up_reason = f"nothing from Redis for {silent:.1f} s (PING unanswered)"
            return Due.GIVE_UP
        if silent >= self.policy.ping_interval and now - self._last_ping >= self.policy.ping_interval:
            return Due.PING
        return Due.NOTHING

    def wake_in(self, now: float) -> float:
        """LIVE: seconds until :meth:`poll` may answer something else than NOTHING (at
        most TICK, at least 10 ms)."""
        p = self.policy
        quiet_from = max(self._last_heard, self._last_ping)
        due = min(quiet_from + p.ping_interval, self._last_heard + p.silence_timeout)
        return max(0.01, min(TICK, due - now))

    def lost(self) -> float:
        """The connection is gone: the delay before the next attempt (jittered, growing)."""
        self.phase = Phase.IDLE
        delay = self._next_delay
        self._next_delay = min(delay * 2, self.policy.max_delay)
        spread = self.policy.jitter * (2 * self._rng() - 1)
        return max(0.0, delay * (1 + spread))


@dataclass
class OutageNotice:
    """What an outage of a Redis connection is worth telling the operator: one line per change
    of state (lost, still failing, back) and nothing for each further attempt, so a Redis
    that is down for minutes costs three log lines, not one per retry. Pure: ``now`` passed in.

    :meth:`failed` after a connection ended (``was_up``: it had been working) or an attempt
    failed; :meth:`up` once it works again. Each returns ``(level, text)`` to log, or None.
    """

    name: str
    down_since: float | None = None
    attempts: int = 0
    said_retrying: bool = False

    def failed(self, now: float, reason: str, *, was_up: bool) -> tuple[int, str] | None:
        if was_up or self.down_since is None:
            first = self.down_since is None
            self.down_since, self.attempts, self.said_retrying = now, 0, False
            if was_up:
                return logging.WARNING, f"{self.name} lost: {reason}; retrying (said again when it is back)"
            if first:
                return logging.WARNING, f"{self.name}: cannot connect: {reason}; retrying (said again when it is back)"
        self.attempts += 1
        if not self.said_retrying:
            self.said_retrying = True
            return logging.WARNING, f"{self.name} still down: {reason}; retrying with back-off, quietly"
        return None

    def up(self, now: float) -> tuple[int, str] | None:
        if self.down_since is None:
            return None
        down_for, attempts = now - self.down_since, self.attempts
        self.down_since, self.attempts, self.said_retrying = None, 0, False
        return logging.INFO, f"{self.name} back after {down_for:.1f} s ({attempts} failed attempts)"


class RedisSubscription:
    """Keeps ``channels`` subscribed on ``url`` until :meth:`stop`, running the owner's hooks.

    * ``on_subscribed()``: awaited once every SUBSCRIBE is confirmed, before anything is read
      (publish REPLICATE, announce positions...); raising gives the connection up.
    * ``on_chunk(data)``: every chunk of raw bytes read after that (pub/sub messages and PONGs,
      split anywhere: see :mod:`.resp` to take them apart); a coroutine is awaited.
    * ``on_lost(reason)``: the subscription ended (also after a failed attempt; ``reason`` is
      None on stop); messages may have been lost from here until the next ``on_subscribed``.

    ``read_pause``: after a chunk that did not fill a read, wait this long before reading
    again, so that what arrives meanwhile is handed over in one chunk. For owners that only
    search the stream for a few rare messages (the bridge): a busy channel arrives in many
    small pieces (Redis writes out what each 16 KiB it reads published), and each wake-up
    costs more than searching the bytes. A full read is followed at once, so a subscriber
    never falls behind a channel for it.

    ``read_size``: the connection's (:class:`~.resp.RespConnection`): the most one chunk
    holds.

    ``counters`` (a Counter, the owner's if given): ``connection_attempts``,
    ``subscriptions``, ``ping_timeouts``.
    """

    def __init__(self, url: str, channels: Sequence[bytes], *,
                 on_subscribed: Callable[[], Awaitable[None]],
                 on_chunk: Callable[[bytes], Awaitable[None] | None],
                 on_lost: Callable[[str | None], None] = lambda reason: None,
                 policy: SubscriptionPolicy = SubscriptionPolicy(), name: str = "Redis subscription",
                 clock: Callable[[], float] = time.monotonic, rng: Callable[[], float] = random.random,
                 counters: Counter[str] | None = None, read_pause: float = 0.0,
                 read_size: int = READ_SIZE) -> None:
        self.url = url
        self.read_pause = read_pause
        self.read_size = read_size
        self.channels = list(channels)
        self.name = name
        self.machine = SubscriptionMachine(policy, rng=rng)
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self._on_subscribed, self._on_chunk, self._on_lost = on_subscribed, on_chunk, on_lost
        self._clock = clock
        self._stopping = False
        self._stop_event = asyncio.Event()
        self._established = False
        self._session_task: asyncio.Future[str] | None = None
        self.outage = OutageNotice(name)

    @property
    def established(self) -> bool:
        """Subscribed, and the owner's ``on_subscribed`` went through."""
        return self._established

    def stop(self) -> None:
        """Make :meth:`run` return soon (from the loop's thread)."""
        self._stopping = True
        self._stop_event.set()
        if self._session_task is not None:
            self._session_task.cancel()

    async def run(self) -> None:
        """Subscribe, read, and resubscribe after every loss, until :meth:`stop`."""
        while not self._stopping:
            task = self._session_task = asyncio.ensure_future(self._session())
            try:
                # Waited for, not awaited: our own cancellation lands here, whatever the
                # session does with one passed on to it. A session once read on after its
                # cancellation while whoever had cancelled us waited forever (the test suite
                # on two processes; asyncio in Python 3.11 can lose a cancellation in a race);
                # so it is told to stop (its loop checks at least every TICK) and cancelled
                # again until it has ended.
                await asyncio.wait([task])
            except asyncio.CancelledError:
                self._stopping = True
                while not task.done():
                    task.cancel()
                    await asyncio.wait([task], timeout=TICK)
                raise
            finally:
                self._session_task = None
            reason = "stopped" if task.cancelled() else task.result()
            self._on_lost(None if self._stopping else reason)
            if self._stopping:
                break
            delay = self.machine.lost()
            notice = self.outage.failed(self._clock(), f"{reason} ({redact_url(self.url)})",
                                        was_up=self._established)
            if notice is not None:
                logger.log(*notice)
            try:
                await asyncio.wait_for(self._stop_event.wait(), delay)
            except TimeoutError:
                pass

    async def _session(self) -> str:
        """One connection, from connect to loss; returns why it ended."""
        machine, clock = self.machine, self._clock
        self._established = False
        self.counters["connection_attempts"] += 1
        machine.attempt(clock())
        conn: RespConnection | None = None
        try:
            conn = await RespConnection.open(self.url, machine.policy.confirm_timeout, self.read_size)
            conn.write(pack_command("SUBSCRIBE", *self.channels))
            for _ in self.channels:
                # Nothing is read before every confirmation (as ``synapse/replication/tcp/redis.py``): what the owner
                # publishes in on_subscribed is then sure to come back to us.
                try:
                    reply = await conn.read_reply(machine.confirm_time_left(clock()))
                except TimeoutError:
                    return f"SUBSCRIBE not confirmed within {machine.policy.confirm_timeout:g} s"
                if not (isinstance(reply, list) and len(reply) == 3 and reply[0] == b"subscribe"
                        and reply[1] in self.channels):
                    return f"unexpected answer to SUBSCRIBE: {reply!r}"[:300]
            machine.confirmed(clock())
            self.counters["subscriptions"] += 1
            async with asyncio.timeout(machine.policy.confirm_timeout):  # not wait_for: resp.py
                await self._on_subscribed()
            machine.established()
            self._established = True
            notice = self.outage.up(clock())
            if notice is not None:
                logger.log(*notice)
            return await self._read(conn)
        except (RespError, OSError, TimeoutError) as e:
            return str(e) or type(e).__name__
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the owner's hook failed: log it, start a new subscription
            logger.exception("%s failed", self.name)
            return repr(e)
        finally:
            if conn is not None:
                await conn.close()

    async def _read(self, conn: RespConnection) -> str:
        machine, clock, on_chunk = self.machine, self._clock, self._on_chunk
        while not self._stopping:
            now = clock()
            due = machine.poll(now)
            if due is Due.GIVE_UP:
                self.counters["ping_timeouts"] += 1
                return machine.give_up_reason
            if due is Due.PING:
                conn.write(pack_command("PING"))
                machine.pinged(now)
            chunk = await conn.read_chunk(machine.wake_in(now))
            if not chunk:
                continue
            machine.heard(clock())
            result = on_chunk(chunk)
            if result is not None:
                await result
            if self.read_pause and len(chunk) < self.read_size:
                await asyncio.sleep(self.read_pause)
        return "stopped"
