"""What a live Synapse says on its Redis, kept per stream writer and per process: the observer's
pure core (docs/attach.md, "Watching Synapse's Redis"). Fed the lines of Synapse's channel (or
commands parsed by the project's codec) with ``now`` passed in (seconds, monotonic); reads no
clock and touches no socket (the adapter is ``redis_observer.py``).

Per (stream, instance): the last position the writer announced live (the numeric token of an
``RDATA``, the new token of a ``POSITION``), when it last advanced, the position of its last
write (the last numeric ``RDATA`` token: what Synapse records in ``stream_positions`` after a
write, or a little more, as it records the position it has reached by then), and the rows
(facts) it sent, for facts/s. Per instance: its last sign of life and the commands seen from
it. Commands that name no instance (``USER_IP``, ``REMOTE_SERVER_UP``, ``REPLICATE``...) are counted apart;
``USER_SYNC``/``CLEAR_USER_SYNC`` name a random ID of the process run, not the instance.

**Stuck (laggard) writers.** Synapse's ``MultiWriterIdGenerator`` lets a writer with nothing in
flight move its own position up to the largest ID it has seen handed out by the others, and its
replication resource checks every second whether a stream's position moved and, if it did with
no row to send, announces it with a ``POSITION``. So a healthy writer, busy or idle, announces a
position at or above the others' within about a second after they advance. A writer whose
announced position stays below a position another writer of the same stream announced since has
either IDs in flight it does not finish (a slow or hung transaction), or is not running; either
way the readers of the stream cannot count on it (they wait on its in-flight IDs, and
``wait_for_stream_position`` on it). The rule:

* a writer is *behind* from the first moment another writer of the stream announces a position
  above its own, unless it has advanced since; any advance of its own restarts the clock (it
  still works), and it is no longer behind once its position reaches the highest announced;
* it is *stuck* once it has been behind for ``stuck_after`` seconds, and is named with how long
  it has been behind;
* ``caches`` is exempt: any process writes it and Synapse's idle writers do not echo the others'
  advances there, so an idle process's caches position lags by design.

An idle writer is never stuck: it echoes the others' advances. A stream with one writer has no
one to be behind.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from replication.protocol.commands import (
    ClearUserSyncCommand,
    Command,
    FederationAckCommand,
    LockReleasedCommand,
    PositionCommand,
    RdataCommand,
    RdataRun,
    RemoteProtocolError,
    UserSyncCommand,
    add_rdata_line,
    parse_line,
)

from .catalogue import STREAMS

#: How long a writer may stay behind the others before it is called stuck: ten times the
#: second in which a healthy Synapse writer echoes the others' advances, so a busy machine's
#: hiccup is not an alarm.
STUCK_AFTER = 10.0
#: The window facts/s is measured over.
RATE_WINDOW = 60.0
#: At most this many writers and instances are tracked: names come off the wire, and memory
#: stays flat whatever is published (a real cluster has tens).
MAX_TRACKED = 1024
#: Streams whose idle writers do not echo the others' positions (any process writes them).
NOT_ECHOED: frozenset[str] = frozenset(s.name for s in STREAMS if s.replicated and not s.records_positions)


@dataclass
class WriterLive:
    """One writer of one stream as seen on Redis."""

    stream: str
    instance: str
    position: int | None = None
    written: int | None = None
    advanced_at: float | None = None
    behind_since: float | None = None
    facts: int = 0
    #: (time, facts) samples at most a second apart, over RATE_WINDOW: facts/s.
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def facts_per_second(self, now: float) -> float:
        if not self.samples:
            return 0.0
        start, facts = self.samples[0]
        span = now - start
        return (self.facts - facts) / span if span > 0 else 0.0

    def _sample(self, now: float) -> None:
        samples = self.samples
        if not samples or now - samples[-1][0] >= 1.0:
            samples.append((now, self.facts))
        while len(samples) > 1 and now - samples[1][0] >= RATE_WINDOW:
            samples.popleft()


@dataclass
class InstanceLive:
    """One Synapse process (or a process run's ID, for USER_SYNC) as seen on Redis."""

    name: str
    last_seen: float
    commands: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class StuckWriter:
    stream: str
    instance: str
    position: int
    highest: int
    behind_for: float

    def as_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "instance": self.instance, "position": self.position,
                "highest": self.highest, "behind_seconds": round(self.behind_for, 1)}


def _instance_of(command: Command) -> str | None:
    if isinstance(command, (RdataCommand, PositionCommand)):
        return command.instance_name
    if isinstance(command, (FederationAckCommand, LockReleasedCommand)):
        return command.instance_name
    if isinstance(command, (UserSyncCommand, ClearUserSyncCommand)):
        return command.instance_id
    return None


class SynapseObserver:
    """The live picture of one Synapse's replication, from the commands on its Redis."""

    def __init__(self, *, stuck_after: float = STUCK_AFTER, started: float = 0.0) -> None:
        self.stuck_after = stuck_after
        self.started = started
        self.writers: dict[tuple[str, str], WriterLive] = {}
        self._by_stream: dict[str, list[WriterLive]] = {}
        self.instances: dict[str, InstanceLive] = {}
        self.unattributed: Counter[str] = Counter()
        self.lines = 0
        self.bad_lines = 0
        self.untracked = 0
        self.last_line_at: float | None = None

    # --- input -----------------------------------------------------------------------------

    def observe_line(self, line: str, now: float) -> None:
        """One line of Synapse's channel; one that does not parse is counted and dropped."""
        self.observe_lines((line,), now)

    def observe_lines(self, lines: Iterable[str], now: float) -> None:
        """The lines of one read, in order. RDATA lines go the replication worker's way
        (``add_rdata_line``: runs of one stream and writer, no command object per line)."""
        items: list[Any] = []
        seen = self.lines
        for line in lines:
            self.lines += 1
            if add_rdata_line(items, line):
                continue
            if not line.strip():
                continue
            try:
                items.append(parse_line(line))
            except RemoteProtocolError:
                self.bad_lines += 1
        if self.lines != seen:
            self.last_line_at = now
        for item in items:
            if type(item) is RdataRun:
                self._observe_run(item, now)
            else:
                self.observe(item, now)

    def _observe_run(self, run: RdataRun, now: float) -> None:
        if self._seen(run.instance_name, "RDATA", now, len(run.entries)):
            token = next((t for t, _ in reversed(run.entries) if t is not None), None)
            self._rdata(run.stream_name, run.instance_name, len(run.entries), token, now)

    def _rdata(self, stream: str, instance: str, count: int, token: int | None, now: float) -> None:
        """``count`` rows of ``stream`` by ``instance``, the last numeric token ``token``."""
        writer = self._writer(stream, instance)
        if writer is None:
            return
        writer._sample(now)
        writer.facts += count
        if token is not None:
            writer.written = token
            self._announce(writer, token, now)

    def _seen(self, name: str, kind: str, now: float, count: int = 1) -> bool:
        """A sign of life of instance ``name``; False when it is beyond the bound (dropped)."""
        instance = self.instances.get(name)
        if instance is None:
            if len(self.instances) >= MAX_TRACKED:
                self.untracked += 1
                return False
            instance = self.instances[name] = InstanceLive(name, now)
        instance.last_seen = now
        instance.commands[kind] += count
        return True

    def observe(self, command: Command, now: float) -> None:
        """One parsed command (an RDATA is one fact)."""
        name = _instance_of(command)
        if name is None:
            self.unattributed[command.NAME] += 1
        elif not self._seen(name, command.NAME, now):
            return
        if isinstance(command, RdataCommand):
            self._rdata(command.stream_name, command.instance_name, 1, command.token, now)
        elif isinstance(command, PositionCommand):
            writer = self._writer(command.stream_name, command.instance_name)
            if writer is not None:
                writer._sample(now)
                self._announce(writer, command.new_token, now)

    def _writer(self, stream: str, instance: str) -> WriterLive | None:
        key = (stream, instance)
        writer = self.writers.get(key)
        if writer is None:
            if len(self.writers) >= MAX_TRACKED:
                self.untracked += 1
                return None
            writer = self.writers[key] = WriterLive(stream, instance)
            self._by_stream.setdefault(stream, []).append(writer)
        return writer

    def _announce(self, writer: WriterLive, position: int, now: float) -> None:
        """``writer`` announced ``position``: the behind clocks of the stream's writers."""
        if writer.position is None or position > writer.position:
            writer.advanced_at = now
            writer.behind_since = None
        writer.position = position
        if writer.stream in NOT_ECHOED:
            return
        peers = self._by_stream[writer.stream]
        if len(peers) < 2:
            return
        highest = max(w.position for w in peers if w.position is not None)
        for peer in peers:
            if peer.position is None:
                continue
            if peer.position >= highest:
                peer.behind_since = None
            elif peer.behind_since is None:
                peer.behind_since = now

    # --- output ----------------------------------------------------------------------------

    def highest(self, stream: str) -> int | None:
        """The highest position any writer of ``stream`` announced (None: none seen)."""
        return max((w.position for w in self._by_stream.get(stream, ()) if w.position is not None), default=None)

    def stuck(self, now: float) -> list[StuckWriter]:
        """The writers behind the others of their stream for ``stuck_after`` seconds or more."""
        out = []
        for w in self.writers.values():
            if w.behind_since is not None and w.position is not None and now - w.behind_since >= self.stuck_after:
                highest = self.highest(w.stream)
                assert highest is not None
                out.append(StuckWriter(w.stream, w.instance, w.position, highest, now - w.behind_since))
        return sorted(out, key=lambda s: (s.stream, s.instance))

    def as_dict(self, now: float) -> dict[str, Any]:
        """Everything, with times as seconds before ``now`` (JSON-ready)."""
        def ago(t: float | None) -> float | None:
            return None if t is None else round(now - t, 1)

        streams: dict[str, Any] = {}
        for (stream, instance), w in sorted(self.writers.items()):
            entry = streams.setdefault(stream, {"highest": self.highest(stream), "writers": []})
            behind = None if w.behind_since is None else now - w.behind_since
            entry["writers"].append({
                "instance": instance, "position": w.position, "written": w.written, "advanced_seconds_ago": ago(w.advanced_at),
                "facts": w.facts, "facts_per_second": round(w.facts_per_second(now), 2),
                "behind_seconds": None if behind is None else round(behind, 1),
                "stuck": behind is not None and behind >= self.stuck_after})
        return {
            "listening_seconds": round(now - self.started, 1),
            "lines": self.lines, "bad_lines": self.bad_lines, "untracked": self.untracked,
            "last_line_seconds_ago": ago(self.last_line_at),
            "stuck_after_seconds": self.stuck_after,
            "streams": streams,
            "instances": [{"instance": i.name, "last_seen_seconds_ago": ago(i.last_seen),
                           "commands": dict(sorted(i.commands.items()))}
                          for i in sorted(self.instances.values(), key=lambda i: i.name)],
            "unattributed": dict(sorted(self.unattributed.items())),
            "stuck": [s.as_dict() for s in self.stuck(now)],
        }


def format_live(view: dict[str, Any]) -> str:
    """:meth:`SynapseObserver.as_dict`'s view as an operator reads it in a terminal."""
    lines = [f"live (Synapse's Redis, {view['listening_seconds']:g} s): {view['lines']} lines"
             + (f", {view['bad_lines']} unparsable" if view["bad_lines"] else "")]
    for stream, entry in view["streams"].items():
        lines.append(f"{stream}: highest announced {entry['highest']}")
        for w in entry["writers"]:
            state = ""
            if w["stuck"]:
                state = f", STUCK: behind for {w['behind_seconds']:g} s"
            lines.append(f"    writer {w['instance']}: position {w['position']}, last write {w['written']}, "
                         f"advanced {w['advanced_seconds_ago']} s ago, {w['facts']} facts "
                         f"({w['facts_per_second']:g}/s){state}")
    for i in view["instances"]:
        kinds = ", ".join(f"{k} {n}" for k, n in i["commands"].items())
        lines.append(f"instance {i['instance']}: last seen {i['last_seen_seconds_ago']:g} s ago ({kinds})")
    if view["unattributed"]:
        lines.append("no instance named: " + ", ".join(f"{k} {n}" for k, n in view["unattributed"].items()))
    if not view["streams"] and not view["instances"]:
        lines.append("nothing heard: Synapse announces a position only when it moves")
    for s in view["stuck"]:
        lines.append(f"stuck: {s['instance']} on {s['stream']} at {s['position']} while another writer "
                     f"announced {s['highest']}, for {s['behind_seconds']:g} s")
    return "\n".join(lines)
