"""This process's view of the cluster, read lazily from ``settings.SYNAPSE_REPL``."""
from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from streams.dialect import several_writers, vendor_allows_several_writers
from streams.registry import STREAMS

DEFAULT_WRITER = "master"


def repl_setting(name: str):
    return settings.SYNAPSE_REPL[name]


def instance_name() -> str:
    return repl_setting("INSTANCE_NAME")


def parse_stream_writers(text: str) -> dict[str, tuple[str, ...]]:
    """Parse ``"events=master,worker1;receipts=worker2"``."""
    result: dict[str, tuple[str, ...]] = {}
    for part in filter(None, (p.strip() for p in text.replace("\n", ";").split(";"))):
        name, sep, writers = part.partition("=")
        names = tuple(w.strip() for w in writers.split(",") if w.strip())
        if not sep or not name.strip() or not names:
            raise ImproperlyConfigured(
                f"STREAM_WRITERS: cannot read {part!r}; expected stream=writer[,writer...]"
            )
        if len(set(names)) != len(names):
            raise ImproperlyConfigured(f"STREAM_WRITERS: {name.strip()} lists a writer twice")
        result[name.strip()] = names
    return result


def stream_writers(text: str | None = None, *, vendor: str | None = None) -> dict[str, tuple[str, ...] | None]:
    """Writers of every stream (``None``: any process may write, as ``caches``).

    Raises ImproperlyConfigured for an unknown stream, several writers of a single-writer
    stream, or several writers of any stream on SQLite (one process writes there).
    """

    configured = parse_stream_writers(repl_setting("STREAM_WRITERS") if text is None else text)
    several_allowed = several_writers("default") if vendor is None else vendor_allows_several_writers(vendor)
    for name in configured:
        if name not in STREAMS:
            raise ImproperlyConfigured(
                f"STREAM_WRITERS names unknown stream {name!r}; known: {', '.join(STREAMS)}"
            )
        spec = STREAMS[name]
        if spec.writers_from:
            raise ImproperlyConfigured(
                f"STREAM_WRITERS: {name} is written by the {spec.writers_from} writers; configure those"
            )
        if not spec.has_writer_list:
            raise ImproperlyConfigured(f"STREAM_WRITERS: any process may write {name}; remove it")

    result: dict[str, tuple[str, ...] | None] = {}
    for name, spec in STREAMS.items():
        if not spec.has_writer_list:
            result[name] = None
            continue
        writers = configured.get(spec.writers_from or name, (DEFAULT_WRITER,))
        if len(writers) > 1 and not spec.multi_writer:
            raise ImproperlyConfigured(
                f"STREAM_WRITERS: stream {name} allows exactly one writer, got {', '.join(writers)}"
            )
        if len(writers) > 1 and not several_allowed:
            raise ImproperlyConfigured(
                f"STREAM_WRITERS: stream {name} has several writers ({', '.join(writers)}), "
                "which needs PostgreSQL; SQLite supports one writer per stream. "
                "Set DATABASE_URL=postgres://... for a multi-writer cluster."
            )
        result[name] = writers
    return result
