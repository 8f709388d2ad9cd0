"""Room stream tokens in Synapse's forms: ``s<stream>`` (live) and ``t<topological>-<stream>``
(historic). A token is a position *after* an event (Synapse's ``RoomStreamToken``,
``synapse/types/__init__.py``)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from streams.identifiers import fits_stream_id

# ASCII digits only: \d would also take digits of other scripts, which int() accepts.
_LIVE = re.compile(r"s(-?[0-9]+)")
_HISTORIC = re.compile(r"t([0-9]+)-(-?[0-9]+)")


class BadToken(ValueError):
    pass


@dataclass(frozen=True)
class RoomStreamToken:
    stream: int
    topological: int | None = None

    @classmethod
    def parse(cls, text: str) -> "RoomStreamToken":
        m = _LIVE.fullmatch(text) or _HISTORIC.fullmatch(text)
        if m and not all(fits_stream_id(g) for g in m.groups()):
            # past 64 bits (or Python's int() digit limit): no stored position can be there
            raise BadToken(f"room stream token {text[:40]!r}{'...' if len(text) > 40 else ''} is out of range: "
                           "positions are 64-bit integers")
        if m and m.re is _LIVE:
            return cls(int(m.group(1)))
        if m:
            return cls(int(m.group(2)), int(m.group(1)))
        if text.startswith("m"):
            raise BadToken(f"multi-writer token {text[:40]!r} is not supported by this store; use s<stream> or t<topo>-<stream>")
        raise BadToken(f"invalid room stream token {text[:40]!r}: expected s<stream> or t<topological>-<stream>")

    def __str__(self) -> str:
        if self.topological is None:
            return f"s{self.stream}"
        return f"t{self.topological}-{self.stream}"
