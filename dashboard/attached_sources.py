"""Streams of a system beside this one (an attached Synapse, ``synapse_attach``), shown by the
dashboard without the dashboard importing it: the composition root (``synapse_repl.apps``)
registers each source's parts here (docs/architecture.md, "Apps and floors").

A source hands in: its entries for ``/status.json`` (under its key), its ``/metrics`` families,
its sections of the streams page (rendered with its template, also re-sent by the live feed),
and its facts/s series for the page's chart."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

if TYPE_CHECKING:  # (prometheus_client loads where /metrics is served, not in every process)
    from prometheus_client.core import Metric


@dataclass(frozen=True)
class AttachedSource:
    #: the key of its entries in ``/status.json``
    key: str
    status_json: Callable[[], list[dict[str, Any]]]
    metrics: Callable[[], Iterable[Metric]]
    #: its sections of the streams page (what its ``template`` renders as ``sections``)
    page_sections: Callable[[], list[dict[str, Any]]]
    template: str
    #: facts/s per chart series, from its sections
    chart_rates: Callable[[list[dict[str, Any]]], dict[str, float]]


SOURCES: dict[str, AttachedSource] = {}


def register(source: AttachedSource) -> None:
    SOURCES[source.key] = source
