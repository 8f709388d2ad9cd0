"""This process's stream machinery: one ID generator and one writer per stream, built on
first use from the settings, and the notifier every position advance goes through."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from django.apps import apps
from django.conf import settings

from streams.conf import instance_name as configured_instance_name
from streams.conf import stream_writers
from streams.dialect import id_store_for
from streams.id_generator import MultiWriterIdGenerator, NotAWriter
from streams.id_store import table_refs
from streams.notifier import PositionNotifier, WireJournal
from streams.registry import STREAMS, get_stream
from streams.writer import StreamWriter


@dataclass(frozen=True)
class RuntimeParts:
    """What the composition root hands the runtime: the parts that live on higher floors (the
    typing writer and the replication streamer are the replication app's). Missing, the runtime
    says so when a process asks for one."""

    #: ``TypingWriter(instance_name, notifier, clock=...)``
    typing_writer: Callable[..., Any] | None = None
    #: ``ReplicationStreamer(notifier, loop=, layer=, redis_url=, server_name=)``
    streamer: Callable[..., Any] | None = None


_PARTS = RuntimeParts()


def provide_parts(parts: RuntimeParts) -> None:
    """Called once per process by the composition root (``synapse_repl/apps.py``)."""
    global _PARTS
    _PARTS = parts


class StreamRuntime:
    def __init__(
        self,
        *,
        instance_name: str,
        writers: dict[str, tuple[str, ...] | None],
        using: str = "default",
        clock: Callable[[], float] = time.time,
        parts: RuntimeParts | None = None,
    ) -> None:
        self.parts = parts or _PARTS
        self.instance_name = instance_name
        self.writers = writers
        self.using = using
        self.clock = clock
        self.notifier = PositionNotifier()
        self._generators: dict[str, MultiWriterIdGenerator] = {}
        self._writers: dict[str, StreamWriter] = {}
        self._typing = None  # TypingWriter, when this process writes the typing stream
        self._lock = threading.Lock()
        self.streamer = None
        #: the room event store's read caches for this database (``rooms.storage.caches``),
        #: created on first use
        self.storage_caches: Any = None

    def generator(self, stream_name: str) -> MultiWriterIdGenerator:
        with self._lock:
            gen = self._generators.get(stream_name)
            if gen is None:
                spec = get_stream(stream_name)
                if not spec.db_backed:
                    raise ValueError(f"stream {stream_name} is kept in memory; it has no ID generator")
                store = id_store_for(
                    self.using,
                    stream_name=spec.name,
                    sequence=spec.sequence,
                    tables=table_refs(spec.tables),
                    instance_name=self.instance_name,
                    backwards=spec.backwards,
                )
                gen = MultiWriterIdGenerator(
                    stream_name=spec.name,
                    instance_name=self.instance_name,
                    store=store,
                    writers=self.writers[spec.name],
                    backwards=spec.backwards,
                    notifier=self.notifier,
                    clock=self.clock,
                )
                if self.streamer is not None:
                    gen.journal = WireJournal()
                self._generators[stream_name] = gen
            return gen

    def writer(self, stream_name: str) -> StreamWriter:
        gen = self.generator(stream_name)
        with self._lock:
            writer = self._writers.get(stream_name)
            if writer is None:
                writer = self._writers[stream_name] = StreamWriter(get_stream(stream_name), gen, using=self.using)
            return writer

    def is_writer_of(self, stream_name: str) -> bool:
        writers = self.writers.get(stream_name)
        return writers is None or self.instance_name in writers

    def in_memory_positions(self) -> dict[str, dict[str, int]]:
        """Positions of the streams this process keeps in memory (typing), per writer, for
        the pages it serves; nothing for a stream whose writer is not running here."""
        with self._lock:
            typing = self._typing
        return {"typing": {self.instance_name: typing.current_token}} if typing is not None else {}

    def typing(self):
        """This process's typing writer (in memory, replication/typing_stream.py); built on first use,
        when it announces that it starts from 0. Raises ``NotAWriter`` elsewhere."""
        with self._lock:
            if self._typing is None:
                if not self.is_writer_of("typing"):
                    raise NotAWriter(f"{self.instance_name} is not the writer of typing (writer: "
                                     f"{', '.join(self.writers.get('typing') or ())})")
                if self.parts.typing_writer is None:
                    raise RuntimeError("this process's runtime was handed no typing writer (RuntimeParts)")
                self._typing = self.parts.typing_writer(self.instance_name, self.notifier, clock=self.clock)
                if self.streamer is not None:
                    self._typing.journal = WireJournal()
                typing = self._typing
            else:
                return self._typing
        typing.announce()
        return typing

    def writer_positions(self) -> dict[tuple[str, str], int]:
        """Wire tokens per (stream, writer) of every database-backed stream: the configured
        writers and those this process's generators know of (blocking: may read the
        database). Where an endpoint in this process starts relaying from."""
        result: dict[tuple[str, str], int] = {}
        for name, spec in STREAMS.items():
            if not spec.db_backed:
                continue
            gen = self.generator(name)
            for writer in {*(self.writers.get(name) or ()), *gen.get_positions()}:
                result[(name, writer)] = spec.to_wire(gen.get_current_token_for_writer(writer))
        return result

    def db_streams(self) -> list[str]:
        return [name for name, spec in STREAMS.items() if spec.db_backed]

    def stream_replication(self, loop=None, layer=None, redis_url=None, server_name=None) -> None:
        """Publish this process's writes to every replication endpoint (channel layer).

        ``loop``: the event loop to publish from when the channel layer is in-memory (it
        must be the loop of the endpoint in this process); otherwise a thread of its own.
        """
        with self._lock:
            if self.streamer is not None:
                return
            if self.parts.streamer is None:
                raise RuntimeError("this process's runtime was handed no replication streamer (RuntimeParts)")
            for gen in self._generators.values():
                gen.journal = WireJournal()
            if self._typing is not None:
                self._typing.journal = WireJournal()
            self.streamer = self.parts.streamer(
                self.notifier, loop=loop, layer=layer, redis_url=redis_url,
                server_name=server_name or settings.SYNAPSE_REPL["SERVER_NAME"],
            )

    def close(self) -> None:
        if self.streamer is not None:
            self.streamer.close()
            self.streamer = None
        with self._lock:
            if self._typing is not None:
                self._typing.close()
                self._typing = None
            for gen in self._generators.values():
                gen.close()
            self._generators.clear()
            self._writers.clear()


_CREATE_LOCK = threading.Lock()


def runtime() -> StreamRuntime:
    """The process-wide runtime, kept on the streams app config."""
    config = apps.get_app_config("streams")
    with _CREATE_LOCK:
        rt = getattr(config, "runtime", None)
        if rt is None:
            rt = config.runtime = StreamRuntime(
                instance_name=configured_instance_name(), writers=stream_writers()
            )
            if settings.REDIS_URL:
                # Endpoints in other processes hear of our writes through Redis.
                rt.stream_replication(redis_url=settings.REDIS_URL)
        return rt
