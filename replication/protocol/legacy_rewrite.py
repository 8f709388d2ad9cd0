"""The older protocol generation's form of relayed lines (``RDATA <stream> <token> <row>``,
``POSITION <stream> <token>``: no writer name), made from what a batch is (its writer runs and
commands), for a connection that subscribed with the older ``REPLICATE <stream> <token>``."""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from replication.protocol.commands import (
    LegacyPositionCommand,
    LegacyRdataCommand,
    PositionCommand,
    RdataCommand,
)
from replication.protocol.line_batch import BatchPart, LineBatch, WriterRun


def to_legacy(parts: Iterable[BatchPart], subscribed: Mapping[str, str]) -> LineBatch:
    """Rewrite a batch for a legacy subscriber: only its streams, above the token it was caught
    up to (``subscribed``: stream -> token), without writer names.

    Reads what the batch is (its writer runs and commands), not its bytes: a run of a stream
    not subscribed is skipped whole, and a run wholly above the token is rewritten whole (the
    writer's name cut from each line's prefix); only a run that straddles the token is taken
    line by line, by its tokens (never its JSON).
    """
    out: list[bytes] = []
    waiting: dict[tuple[str, str], list[bytes]] = {}
    rdata = positions = 0
    for part in parts:
        stream = part.stream if type(part) is WriterRun else getattr(part, "stream_name", None)
        if stream is None or stream not in subscribed:
            continue
        done = int(subscribed[stream])
        if type(part) is WriterRun:
            if part.new <= done:
                continue
            if part.prev >= done:
                data = _drop_writer(part)
                n_positions = part.counts.get("POSITION", 0)
                positions += n_positions
                rdata += part.counts.get("RDATA", 0)
            else:
                data, n_rdata, n_positions = _straddling(part, done)
                rdata += n_rdata
                positions += n_positions
            out.append(data)
        elif type(part) is RdataCommand:
            # A single command (the embedded scan): ``batch`` rows wait for the token that ends
            # their fact, and go (or not) with it.
            rows = waiting.setdefault((stream, part.instance_name), [])
            rows.append((LegacyRdataCommand(stream, part.token, part.row).to_line() + "\n").encode())
            if part.token is not None:
                if part.token > done:
                    out += rows
                    rdata += len(rows)
                rows.clear()
        elif type(part) is PositionCommand and part.new_token > done:
            out.append((LegacyPositionCommand(stream, part.new_token).to_line() + "\n").encode())
            positions += 1
    counts = {name: n for name, n in (("RDATA", rdata), ("POSITION", positions)) if n}
    return LineBatch(b"".join(out), counts)


def _drop_writer(run: WriterRun) -> bytes:
    """Every line of ``run`` without the writer's name: ``RDATA s w rest`` -> ``RDATA s rest``,
    ``POSITION s w a b`` -> ``POSITION s b``. A line starts after a newline and no encoded row
    holds one (compact JSON), so the prefixes are matched only where lines start."""
    data = (b"\n" + run.data).replace(f"\nRDATA {run.stream} {run.writer} ".encode(), f"\nRDATA {run.stream} ".encode())
    if run.counts.get("POSITION"):
        prefix = f"\nPOSITION {run.stream} {run.writer} ".encode()
        pieces = data.split(prefix)
        # each piece after the first starts with "a b\n...": keep "b\n..."
        data = pieces[0] + b"".join(f"\nPOSITION {run.stream} ".encode() + piece.split(b" ", 1)[1]
                                    for piece in pieces[1:])
    return data[1:]


def _straddling(run: WriterRun, done: int) -> tuple[bytes, int, int]:
    """The lines of ``run`` above ``done``, legacy form, by each line's token field. Rows of a
    fact (``batch`` lines) are kept or dropped with the line that ends it."""
    rdata_prefix = f"RDATA {run.stream} {run.writer} ".encode()
    position_prefix = f"POSITION {run.stream} {run.writer} ".encode()
    legacy_rdata = f"RDATA {run.stream} ".encode()
    out: list[bytes] = []
    fact: list[bytes] = []  # batch rows waiting for the token that ends their fact
    rdata = positions = 0
    for line in run.data.splitlines():
        if line.startswith(rdata_prefix):
            rest = line[len(rdata_prefix):]
            fact.append(legacy_rdata + rest)
            token = rest.split(b" ", 1)[0]
            if token != b"batch":
                if int(token) > done:
                    out += fact
                    rdata += len(fact)
                fact = []
        elif line.startswith(position_prefix):
            new = int(line.rsplit(b" ", 1)[1])
            if new > done:
                out.append(b"POSITION %s %d" % (run.stream.encode(), new))
                positions += 1
    return b"".join(line + b"\n" for line in out), rdata, positions
