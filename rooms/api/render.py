"""JSON responses that carry stored event JSON as it is (no decode/re-encode: lossless, fast)."""
from __future__ import annotations

import json
from typing import Any

from django.http import HttpResponse

from rooms.storage.reads import EventRow
from rooms.storage.tokens import RoomStreamToken


def _encode(obj: Any, out: list[bytes]) -> None:
    if isinstance(obj, EventRow):
        out.append(obj.json)
    elif isinstance(obj, (bytes, memoryview)):
        out.append(bytes(obj))  # already JSON
    elif isinstance(obj, RoomStreamToken):
        out.append(json.dumps(str(obj)).encode())
    elif isinstance(obj, dict):
        out.append(b"{")
        for i, (k, v) in enumerate(obj.items()):
            if i:
                out.append(b",")
            out.append(json.dumps(str(k)).encode() + b":")
            _encode(v, out)
        out.append(b"}")
    elif isinstance(obj, (list, tuple)):
        out.append(b"[")
        for i, v in enumerate(obj):
            if i:
                out.append(b",")
            _encode(v, out)
        out.append(b"]")
    else:
        out.append(json.dumps(obj).encode())


def json_response(obj: Any, status: int = 200) -> HttpResponse:
    out: list[bytes] = []
    _encode(obj, out)
    return HttpResponse(b"".join(out), status=status, content_type="application/json")
