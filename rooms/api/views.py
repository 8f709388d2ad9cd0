"""GET endpoints over rooms.storage.reads; every parameter is checked, bad ones get a 400."""
from __future__ import annotations

from typing import Any, Callable

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from rooms.api.api_access import api_view
from rooms.api.render import json_response
from rooms.storage import reads
from rooms.storage.sql import StorageUnsupported
from rooms.storage.tokens import BadToken, RoomStreamToken
from streams.identifiers import bad_identifier, is_whole_number


class BadParam(ValueError):
    pass


def _int(request: HttpRequest, name: str, default: int, lo: int = 1, hi: int | None = None) -> int:
    """An integer parameter; page sizes are capped by ``API_MAX_LIMIT`` (never above what the
    reads allow)."""
    if hi is None:
        hi = min(int(settings.API_MAX_LIMIT), reads.MAX_LIMIT)
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return default
    if not is_whole_number(raw) or len(raw) > 19:
        raise BadParam(f"{name} must be an integer between {lo} and {hi}, not {raw[:40]!r}")
    value = int(raw)
    if not lo <= value <= hi:
        raise BadParam(f"{name} must be between {lo} and {hi}")
    return value


def _token(request: HttpRequest, name: str) -> RoomStreamToken | None:
    raw = request.GET.get(name)
    if not raw:
        return None
    try:
        return RoomStreamToken.parse(raw)
    except BadToken as e:
        raise BadParam(f"{name}: {e}") from None


def _identifier(name: str, value: str) -> str:
    """A user, room or event ID from the path or the query: no NUL or control characters
    (PostgreSQL refuses NUL outright), at most 255 characters."""
    problem = bad_identifier(name, value)
    if problem:
        raise BadParam(problem)
    return value


def _user(request: HttpRequest, required: bool = True) -> str | None:
    user = request.GET.get("user_id") or None
    if user is None and required:
        raise BadParam("user_id is required")
    if user is not None:
        _identifier("user_id", user)
        if not (user.startswith("@") and ":" in user):
            raise BadParam(f"user_id must look like @name:server, not {user!r}")
    return user


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    @api_view
    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(request, *args, **kwargs)
        except BadParam as e:
            return JsonResponse({"error": str(e)}, status=400)
        except reads.NotFound as e:
            return JsonResponse({"error": str(e)}, status=404)
        except StorageUnsupported as e:
            return JsonResponse({"error": str(e)}, status=501)

    view.__name__ = fn.__name__
    return view


@_guarded
def room_state(request: HttpRequest, room_id: str) -> Any:
    _identifier("room_id", room_id)
    at = request.GET.get("at")
    if not at:
        raise BadParam("at=<event_id> is required")
    _identifier("at", at)
    event = reads.get_event(at, user_id=_user(request, required=False))
    if event.room_id != room_id:
        raise reads.NotFound(f"event {at} is not in {room_id}")
    state = reads.state_at_event(at)
    return json_response({"room_id": room_id, "at": at, "state": [
        {"type": t, "state_key": k, "event_id": e} for (t, k), e in sorted(state.items())]})


@_guarded
def room_messages(request: HttpRequest, room_id: str) -> Any:
    _identifier("room_id", room_id)
    direction = request.GET.get("dir", "b")
    if direction not in ("b", "f"):
        raise BadParam("dir must be 'b' or 'f'")
    page = reads.room_messages(room_id, _user(request), from_token=_token(request, "from"), direction=direction,
                               limit=_int(request, "limit", 10))
    if not page["chunk"] and not reads.room_known(room_id):
        raise reads.NotFound(f"room {room_id} not found")
    return json_response(page)


@_guarded
def room_topological(request: HttpRequest, room_id: str) -> Any:
    _identifier("room_id", room_id)
    page = reads.topological_events(room_id, user_id=_user(request, required=False),
                                    from_token=_token(request, "from"), limit=_int(request, "limit", 100))
    if not page["chunk"] and not reads.room_known(room_id):
        raise reads.NotFound(f"room {room_id} not found")
    return json_response(page)


@_guarded
def event(request: HttpRequest, event_id: str) -> Any:
    _identifier("event_id", event_id)
    row = reads.get_event(event_id, user_id=_user(request, required=False))
    return json_response({"event": row, "token": row.token, "stream_ordering": row.stream_ordering})


@_guarded
def sync(request: HttpRequest) -> Any:
    return json_response(reads.sync(_user(request), since=_token(request, "since"), limit=_int(request, "limit", 10),
                                    rooms=_int(request, "rooms", 100)))
