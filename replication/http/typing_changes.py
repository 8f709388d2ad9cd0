"""``POST /_synapse/replication/typing``: typing changes for the typing writer (this process),
and the client other processes (``write_facts typing``) call it with. See docs/streams.md.

Synapse routes a client's ``PUT /rooms/<room>/typing/<user>`` to its typing writer; this
project has no client API, so the writer takes the changes here, behind
``REPLICATION_SECRET`` like every ``/_synapse/replication/`` view. Body::

    {"updates": [{"room_id": "!r:hs", "user_id": "@u:hs", "typing": true, "timeout": 30000}, ...]}

(``timeout`` in ms, default 30 s, at most 120 s, as Synapse caps it; at most
:data:`MAX_UPDATES` changes a request.) Answer: ``{"stream_id": N, "writer": NAME}``, the
typing stream's position after the changes; 429 ``M_LIMIT_EXCEEDED`` naming the change a
bound of the typing state refused (a room whose row would no longer fit one replication
line, too many typers) and saying that the changes before it were applied. A process that is not the typing writer answers
400 naming the writer.
"""
from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from replication.http.replication_secret import bearer_header, replication_secret_required
from replication.typing_stream import DEFAULT_TIMEOUT_MS, TypingRefused, TypingWriter
from streams.id_generator import NotAWriter
from streams.runtime import runtime

MAX_UPDATES = 1000
MAX_ID_LENGTH = 255


def _error(message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"errcode": "M_INVALID_PARAM", "error": message}, status=status)


def parse_updates(body: bytes) -> list[tuple[str, str, bool, int]]:
    """The changes of a request body; ValueError with the reason if it is not well-formed."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("body is not JSON") from None
    updates = data.get("updates") if isinstance(data, dict) else None
    if not isinstance(updates, list) or not updates:
        raise ValueError('expected {"updates": [...]} with at least one change')
    if len(updates) > MAX_UPDATES:
        raise ValueError(f"at most {MAX_UPDATES} changes a request")
    changes = []
    for n, update in enumerate(updates):
        if not isinstance(update, dict):
            raise ValueError(f"updates[{n}] is not an object")
        room_id, user_id, typing = update.get("room_id"), update.get("user_id"), update.get("typing")
        timeout = update.get("timeout", DEFAULT_TIMEOUT_MS)
        for what, value, sigil in (("room_id", room_id, "!"), ("user_id", user_id, "@")):
            if (not isinstance(value, str) or not value.startswith(sigil) or ":" not in value
                    or len(value) > MAX_ID_LENGTH or not value.isprintable()):
                raise ValueError(f"updates[{n}].{what} must be a {sigil}...:server ID of at most "
                                 f"{MAX_ID_LENGTH} printable characters")
        if type(typing) is not bool:
            raise ValueError(f"updates[{n}].typing must be true or false")
        if type(timeout) is not int or timeout < 0:
            raise ValueError(f"updates[{n}].timeout must be a whole number of milliseconds")
        changes.append((room_id, user_id, typing, timeout))
    return changes


def typing_writer() -> TypingWriter:
    """This process's typing writer: the one place the replication views reach the process's
    runtime (they are its edge, as Django builds them). Raises ``NotAWriter`` elsewhere."""

    return runtime().typing()


@csrf_exempt  # a process-to-process API behind the replication secret, not a form
@replication_secret_required
@require_POST
def set_typing(request: HttpRequest) -> JsonResponse:
    try:
        changes = parse_updates(request.body)
    except ValueError as e:
        return _error(str(e))
    try:
        writer = typing_writer()
    except NotAWriter as e:
        return JsonResponse({"errcode": "M_UNKNOWN", "error": str(e)}, status=400)
    try:
        stream_id = writer.apply(changes)
    except TypingRefused as e:  # a bound (docs/replication.md, "Typing"): nothing from the refused change on
        return JsonResponse({"errcode": "M_LIMIT_EXCEEDED", "error": str(e)}, status=429)
    return JsonResponse({"stream_id": stream_id, "writer": writer.instance_name})


def send_typing(base_url: str, changes: list[dict[str, Any]], *, secret: str, timeout: float = 30.0) -> dict[str, Any]:
    """POST ``changes`` to the typing writer at ``base_url``; its answer. Raises
    ``RuntimeError`` with the writer's message on a refusal."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        base_url.rstrip("/") + "/_synapse/replication/typing",
        data=json.dumps({"updates": changes}).encode(), method="POST",
        headers={"Content-Type": "application/json", **bearer_header(secret)},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"the typing writer at {base_url} answered {e.code}: "
                           f"{e.read().decode(errors='replace')[:500]}") from None
