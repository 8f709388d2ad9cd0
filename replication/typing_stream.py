"""The ``typing`` stream: who is typing in which room, kept in memory by its writer, as
Synapse's typing writer keeps it (``synapse/handlers/typing.py``; docs/streams.md).

No table backs it. The writer process holds, per room, the users typing (each until a
timeout) and the serial of the room's last change; one counter hands out serials from 1
and starts again from 0 when the process restarts. A change is a row ``[room_id,
[user_id, ...]]`` (the full list; empty: nobody types any more) at a new serial, sent as RDATA;
a worker that missed rows asks the writer (the catch-up endpoint of this process) for the
rooms changed since its token. Workers notice a restart by the token going backwards and
start over (``follower.Reset``).

:class:`TypingState` is the pure part (no clock, no locks); :class:`TypingWriter` is this
process's writer: a lock, the expiry timer and the position notifier.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from replication.protocol.commands import MAX_LINE_LENGTH, encode_json, rdata_row_budget
from streams.notifier import PositionAdvanced, PositionNotifier, WireJournal

logger = logging.getLogger(__name__)

STREAM = "typing"
#: Synapse's default and cap of a client's typing timeout (ms).
DEFAULT_TIMEOUT_MS = 30_000
MAX_TIMEOUT_MS = 120_000
#: Rooms whose serial is kept; beyond it, the rooms where nobody types that changed longest
#: ago are forgotten (a worker more than that many rooms behind may keep showing someone
#: typing there until the room changes again). Rooms where someone types are never dropped.
MAX_ROOMS = 100_000
#: Users typing at once in one room; more are refused.
MAX_USERS_PER_ROOM = 1_000
#: Users typing at once in all rooms together; more are refused. With the rooms' serials,
#: this bounds the writer's memory (IDs of at most 255 characters: a few tens of MB).
MAX_TYPERS = 100_000
#: Bytes of rows after which the writer announces its changes so far, even in the middle of
#: a request: what one advance's lines (and their copies on the way out) hold at once.
MAX_ADVANCE_BYTES = 1 << 18
#: How often the writer looks for typing notifications that timed out.
EXPIRY_INTERVAL_SECONDS = 1.0


class TypingRefused(ValueError):
    """A change the state cannot take (a cap); the caller answers 4xx."""


@dataclass(frozen=True)
class TypingUpdates:
    """``updates``: ``(serial, [room_id, users])`` by serial; as ``streams.updates_since.Updates``."""

    updates: list[tuple[int, list[Any]]]
    upto_token: int
    limited: bool


class TypingState:
    """Rooms, who types there until when (ms), and each room's last serial.

    A worker replaces a room's typing set with each row it receives (Synapse's
    ``TypingNotificationHandler.process_replication_rows``), so a room's row cannot be split
    over several lines: what a row may carry is bounded instead. A new typer whose row would
    encode to more than ``max_row_bytes`` (what one RDATA line of this writer has room for:
    :func:`~replication.protocol.commands.rdata_row_budget`) is refused, as are typers
    beyond ``max_users_per_room`` in a room or ``max_typers`` in all."""

    def __init__(self, *, max_rooms: int = MAX_ROOMS, max_users_per_room: int = MAX_USERS_PER_ROOM,
                 max_typers: int = MAX_TYPERS, max_row_bytes: int = rdata_row_budget(STREAM, "master")) -> None:
        self.max_rooms = max_rooms
        self.max_users_per_room = max_users_per_room
        self.max_typers = max_typers
        self.max_row_bytes = max_row_bytes
        self.serial = 0
        #: room -> serial of its last change, in serial order (a changed room moves to the end)
        self._room_serial: dict[str, int] = {}
        #: room -> user -> typing until (ms); only rooms where someone types
        self._typing: dict[str, dict[str, int]] = {}
        #: room -> bytes its users take in its row (each user's JSON string and a comma)
        self._users_bytes: dict[str, int] = {}
        self._typers = 0

    def set_typing(self, room_id: str, user_id: str, typing: bool, until_ms: int) -> tuple[int, list[Any]] | None:
        """Apply one change; the ``(serial, row)`` it produced, or None if nothing changed
        (already typing: only the timeout moves, as in Synapse; not typing: no-op).
        :class:`TypingRefused` (nothing changed) if a new typer would pass a bound."""
        users = self._typing.get(room_id)
        if typing:
            if users is not None and user_id in users:
                users[user_id] = until_ms
                return None
            if self._typers >= self.max_typers:
                raise TypingRefused(f"more than {self.max_typers} users typing in all rooms")
            if users is not None and len(users) >= self.max_users_per_room:
                raise TypingRefused(f"more than {self.max_users_per_room} users typing in {room_id}")
            cost = len(encode_json(user_id)) + 1
            users_bytes = self._users_bytes.get(room_id, 0) + cost
            row_bytes = _row_bytes(room_id, users_bytes)
            if row_bytes > self.max_row_bytes:
                raise TypingRefused(
                    f"{room_id}'s typing row would take {row_bytes} bytes with {user_id} "
                    f"({len(users or ())} users typing there), over the {self.max_row_bytes} one "
                    f"replication line has room for ({MAX_LINE_LENGTH} bytes a line)")
            if users is None:
                if len(self._typing) >= self.max_rooms:
                    raise TypingRefused(f"more than {self.max_rooms} rooms with someone typing")
                users = self._typing[room_id] = {}
            users[user_id] = until_ms
            self._users_bytes[room_id] = users_bytes
            self._typers += 1
        else:
            if users is None or user_id not in users:
                return None
            self._drop(room_id, users, user_id)
        return self._changed(room_id)

    def _drop(self, room_id: str, users: dict[str, int], user_id: str) -> None:
        del users[user_id]
        self._typers -= 1
        if users:
            self._users_bytes[room_id] -= len(encode_json(user_id)) + 1
        else:
            del self._typing[room_id]
            del self._users_bytes[room_id]

    def row_bytes(self, room_id: str) -> int:
        """Bytes of ``encode_json(self.row(room_id))``, kept as users come and go."""
        return _row_bytes(room_id, self._users_bytes.get(room_id, 0))

    def typers(self) -> int:
        return self._typers

    def expire(self, now_ms: int) -> list[tuple[int, list[Any]]]:
        """Stop everyone whose timeout passed; the rows of the rooms that changed."""
        rows = []
        for room_id in [r for r, users in self._typing.items() if any(t <= now_ms for t in users.values())]:
            users = self._typing[room_id]
            for user_id in [u for u, t in users.items() if t <= now_ms]:
                self._drop(room_id, users, user_id)
            rows.append(self._changed(room_id))
        return rows

    def _changed(self, room_id: str) -> tuple[int, list[Any]]:
        self.serial += 1
        self._room_serial.pop(room_id, None)
        self._room_serial[room_id] = self.serial
        if len(self._room_serial) > self.max_rooms:
            self._forget_quiet_rooms()
        return self.serial, self.row(room_id)

    def _forget_quiet_rooms(self) -> None:
        excess = len(self._room_serial) - self.max_rooms
        quiet = (r for r in self._room_serial if r not in self._typing)  # oldest first
        for room_id in list(itertools.islice(quiet, excess)):
            del self._room_serial[room_id]

    def row(self, room_id: str) -> list[Any]:
        return [room_id, sorted(self._typing.get(room_id, ()))]

    def typing_in(self, room_id: str) -> list[str]:
        return sorted(self._typing.get(room_id, ()))

    def rooms(self) -> int:
        return len(self._room_serial)

    def updates_since(self, from_token: int, upto_token: int, limit: int) -> TypingUpdates:
        """Rooms changed in ``(from, upto]``, one row each at its latest serial (Synapse's
        ``get_all_typing_updates``). Strict limit: beyond ``limit`` rows the answer is cut
        and the bound is the last row's serial. A ``from`` above our serial (a worker that
        followed this writer before it restarted) gets nothing: its token is from another run."""
        if from_token >= upto_token:
            return TypingUpdates([], upto_token, False)
        rows = [(serial, self.row(room_id)) for room_id, serial in self._room_serial.items()
                if from_token < serial <= upto_token]
        # _room_serial is kept in serial order: rows come out sorted
        if len(rows) > limit:
            rows = rows[:limit]
            return TypingUpdates(rows, rows[-1][0], True)
        return TypingUpdates(rows, upto_token, False)


def _row_bytes(room_id: str, users_bytes: int) -> int:
    # ["<room>",[<user>,<user>]]: 5 brackets, quotes-and-all room, the users' strings and
    # commas (one fewer comma than users)
    return 5 + len(encode_json(room_id)) + max(users_bytes - 1, 0)


class TypingWriter:
    """This process as the writer of ``typing``: changes go through here, each announced on
    the runtime's notifier (the replication streamer turns it into RDATA), and catch-up
    reads here. Thread-safe; the expiry timer runs on a daemon thread of its own."""

    def __init__(self, instance_name: str, notifier: PositionNotifier, *,
                 clock: Callable[[], float] = time.time, state: TypingState | None = None,
                 expiry_interval: float | None = EXPIRY_INTERVAL_SECONDS) -> None:
        self.instance_name = instance_name
        self.notifier = notifier
        self.clock = clock
        self.state = state or TypingState(max_row_bytes=rdata_row_budget(STREAM, instance_name))
        #: set while a replication streamer listens: the rows of each change until its
        #: advance carries them
        self.journal: WireJournal | None = None
        self._lock = threading.Lock()
        self._published = 0
        self._unannounced_bytes = 0
        self._stop = threading.Event()
        if expiry_interval:
            threading.Thread(target=self._expire_forever, args=(expiry_interval,),
                             name="typing-expiry", daemon=True).start()

    def announce(self) -> None:
        """Tell followers where this writer starts (0 after a restart): relays and workers
        that knew an earlier run see the token go back and start over."""
        with self._lock:
            self.notifier.position_advanced(self._advance(self._published, self.state.serial))

    def set_typing(self, room_id: str, user_id: str, typing: bool, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> int:
        """One user starts (for ``timeout_ms``) or stops typing in a room; the serial after it."""
        return self.apply([(room_id, user_id, typing, timeout_ms)])

    def apply(self, changes: list[tuple[str, str, bool, int]]) -> int:
        """Several changes at once, announced together; the serial after them. A change a cap
        refuses raises :class:`TypingRefused` naming it, after the ones before it were applied
        (and announced); it and the ones after it are not."""
        now_ms = int(self.clock() * 1000)
        with self._lock:
            try:
                for n, (room_id, user_id, typing, timeout_ms) in enumerate(changes):
                    timeout_ms = max(0, min(int(timeout_ms), MAX_TIMEOUT_MS))
                    try:
                        change = self.state.set_typing(room_id, user_id, typing, now_ms + timeout_ms)
                    except TypingRefused as e:
                        raise TypingRefused(f"updates[{n}] refused: {e}; the {n} changes before it were "
                                            f"applied, it and the {len(changes) - n - 1} after it were not") from None
                    self._record(change)
            finally:
                self._announce_locked()
            return self.state.serial

    def expire(self) -> int:
        """Stop typing notifications that timed out; how many rooms changed."""
        now_ms = int(self.clock() * 1000)
        with self._lock:
            rows = self.state.expire(now_ms)
            for change in rows:
                self._record(change)
            self._announce_locked()
        return len(rows)

    def updates_since(self, from_token: int, upto_token: int, limit: int) -> TypingUpdates:
        with self._lock:
            return self.state.updates_since(from_token, upto_token, limit)

    @property
    def current_token(self) -> int:
        return self.state.serial

    def close(self) -> None:
        self._stop.set()

    def _record(self, change: tuple[int, list[Any]] | None) -> None:
        if change is not None and self.journal is not None:
            serial, row = change
            self.journal.record([serial], {serial: [row]})
            self._unannounced_bytes += self.state.row_bytes(row[0])
            if self._unannounced_bytes >= MAX_ADVANCE_BYTES:
                self._announce_locked()

    def _announce_locked(self) -> None:
        self._unannounced_bytes = 0
        new = self.state.serial
        if new != self._published:
            prev, self._published = self._published, new
            # Under the lock: advances reach the streamer in order.
            self.notifier.position_advanced(self._advance(prev, new))

    def _advance(self, prev: int, new: int) -> PositionAdvanced:
        facts = tuple(self.journal.take(prev, new)) if self.journal is not None and new > prev else ()
        return PositionAdvanced(STREAM, self.instance_name, prev, new, facts)

    def _expire_forever(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.expire()
            except Exception:
                logger.exception("typing expiry failed")
