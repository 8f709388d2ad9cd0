"""Room stream tokens in Synapse's forms: ``s<stream>`` (live) and ``t<topological>-<stream>``
(historic). A token is a position *after* an event (storage spec §3.3)."""
from __future__ import annotations

import re
from dataclasses import dataclass

_LIVE = re.compile(r"s(-?\d+)")
_HISTORIC = re.compile(r"t(\d+)-(-?\d+)")


class BadToken(ValueError):
    pass


@dataclass(frozen=True)
class RoomStreamToken:
    stream: int
    topological: int | None = None

    @classmethod
    def parse(cls, text: str) -> "RoomStreamToken":
        m = _LIVE.fullmatch(text)
        if m:
            return cls(int(m.group(1)))
        m = _HISTORIC.fullmatch(text)
        if m:
            return cls(int(m.group(2)), int(m.group(1)))
        if text.startswith("m"):
            raise BadToken(f"multi-writer token {text!r} is not supported by this store; use s<stream> or t<topo>-<stream>")
        raise BadToken(f"invalid room stream token {text!r}: expected s<stream> or t<topological>-<stream>")

    def __str__(self) -> str:
        if self.topological is None:
            return f"s{self.stream}"
        return f"t{self.topological}-{self.stream}"
