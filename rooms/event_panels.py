"""The panels on an event's admin page below its JSON (``streams.admin`` shows them): the room
store's view of the event, its DAG edges, its verdict (rejection reason, auth events), its
state group, and the room state at the event. They are listed in :data:`EVENT_DETAIL_PANELS`;
other code may add a panel with :func:`event_detail_panel`."""
from __future__ import annotations

from typing import Callable
from urllib.parse import urlencode

from django.urls import reverse
from django.utils.html import format_html, format_html_join

from common.breakable import breakable
from rooms.models import Event, EventAuth, EventEdge, EventToStateGroup, Rejection, StateGroup, StateGroupEdge, StateGroupState


def _event_link(event_id: str):
    url = reverse("admin:rooms_event_changelist") + "?" + urlencode({"q": event_id})
    return format_html('<a href="{}">{}</a>', url, breakable(event_id))


def _list(event_ids) -> str:
    ids = list(event_ids)
    if not ids:
        return format_html('<span class="quiet">{}</span>', "none")
    return format_html_join(", ", "{}", ((_event_link(e),) for e in ids))


def edges_panel(event: Event) -> str:
    prevs = EventEdge.objects.filter(event_id=event.event_id).values_list("prev_event_id", flat=True)
    nexts = EventEdge.objects.filter(prev_event_id=event.event_id).values_list("event_id", flat=True)
    return format_html("<p>prev_events: {}</p><p>referenced by: {}</p><p>depth / topological ordering: {} / {}</p>",
                       _list(prevs), _list(nexts), event.depth, event.topological_ordering)


def authorization_panel(event: Event) -> str:
    """Why the event was rejected (it is stored but never state, never shown), and the auth
    events it cites."""
    reason = Rejection.objects.filter(event_id=event.event_id).values_list("reason", flat=True).first()
    auth = EventAuth.objects.filter(event_id=event.event_id).values_list("auth_id", flat=True)
    verdict = (format_html('<p class="rejected">rejected: {}</p>', reason) if reason is not None
               else format_html("<p>{}</p>", "accepted"))
    return format_html("{}<p>auth_events: {}</p>", verdict, _list(auth))


def state_group_panel(event: Event) -> str:
    row = EventToStateGroup.objects.filter(event_id=event.event_id).first()
    if row is None:
        return format_html("<p>{}</p>", "no state group (an outlier, or not persisted by the room store)")
    group = StateGroup.objects.filter(id=row.state_group).first()
    parent = StateGroupEdge.objects.filter(state_group=row.state_group).values_list("prev_state_group", flat=True).first()
    rows = StateGroupState.objects.filter(state_group=row.state_group).count()
    kind = "a full snapshot" if parent is None else f"a delta of group {parent}"
    return format_html("<p>state group {} ({}, {} rows of its own; {} group(s) to its snapshot)</p>",
                       row.state_group, kind, rows, group.chain_length if group else "?")


def state_panel(event: Event) -> str:
    # deferred: the admin loads this module at every process's start-up; the reads (and the
    # persist path behind them, 0.4 s of imports) only an event's page needs
    from rooms.storage.reads import NotFound, state_at_event
    from rooms.storage.sql import StorageUnsupported

    try:
        state = state_at_event(event.event_id)
    except (NotFound, StorageUnsupported) as e:
        return format_html("<p>{}</p>", str(e))
    rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                            ((breakable(t), breakable(k), _event_link(e)) for (t, k), e in sorted(state.items())))
    return format_html('<div class="scroll-x"><table class="state-at-event"><thead><tr><th>type</th><th>state_key</th>'
                       '<th>event</th></tr></thead><tbody>{}</tbody></table></div>', rows)


#: The panels on an event's admin page, in order: ``(title, render(event) -> HTML)``; build the
#: HTML with ``format_html`` (a plain string is shown escaped).
EVENT_DETAIL_PANELS: list[tuple[str, Callable[[Event], str]]] = [
    ("DAG edges", edges_panel),
    ("Authorization", authorization_panel),
    ("State group", state_group_panel),
    ("State at this event", state_panel),
]


def event_detail_panel(title: str) -> Callable[[Callable[[Event], str]], Callable[[Event], str]]:
    """Decorator: show ``render(event)`` (``format_html`` output) under ``title`` on every
    event's page, after the panels above."""
    def add(render: Callable[[Event], str]) -> Callable[[Event], str]:
        EVENT_DETAIL_PANELS.append((title, render))
        return render
    return add
