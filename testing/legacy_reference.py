"""The legacy rewrite as it was before it read the batch's structure: every line parsed back.
Kept as the reference that ``tests/.../test_legacy_rewrite.py`` checks the structured rewrite
against and the baseline ``benchmarks/bench_legacy_rewrite.py`` times it against."""
from __future__ import annotations

from replication.protocol.commands import (
    LegacyPositionCommand,
    LegacyRdataCommand,
    PositionCommand,
    RdataCommand,
    parse_line,
)


def rewrite_by_parsing(data: bytes, subscribed: dict[str, str]) -> list[str]:
    """The legacy lines of ``data`` for a subscriber at tokens ``subscribed`` (stream -> token)."""
    out: list[str] = []
    batch: dict[str, list[str]] = {}
    for line in data.decode().splitlines():
        cmd = parse_line(line)
        stream = getattr(cmd, "stream_name", None)
        if stream not in subscribed:
            continue
        done = int(subscribed[stream])
        if isinstance(cmd, RdataCommand):
            rows = batch.setdefault(stream, [])
            rows.append(LegacyRdataCommand(stream, cmd.token, cmd.row).to_line())
            if cmd.token is not None:
                if cmd.token > done:
                    out.extend(rows)
                rows.clear()
        elif isinstance(cmd, PositionCommand) and cmd.new_token > done:
            out.append(LegacyPositionCommand(stream, cmd.new_token).to_line())
    return out
