"""docs/dashboard.md says how every figure on the pages is computed: each page is rendered
with the test client and every label it shows a figure under -- a table's column header, an
admin field's label, an element's ``data-figure`` -- must have its entry, in bold, under the
doc's heading for that table (its class) or page (its path). A new figure without its line
fails here. So does a ``/metrics`` sample the doc's metrics table does not name."""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboard import worker_status
from jobs.models import JobRun
from synapse_attach.live_status import publish
from tests.dashboard.test_views import endpoint_row, receipts_written  # noqa: F401 (a fixture)
from tests.synapse_attach.test_live_status import database_view, stuck_view

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "dashboard.md").read_text()
LIVE_JS = (ROOT / "static" / "dashboard" / "live.js").read_text()
#: tables whose columns are data (a check's differences: room_id, event_id, ...), not figures
DATA_TABLES = {"differences"}


class Figures(HTMLParser):
    """The labelled figures of one page, as (key, label): a ``<th>`` of a table's ``<thead>``
    keyed by the table's first class (the page's path for a table without one, as the admin's
    lists), a ``<label>`` in a ``<fieldset>`` (an admin form's fields) and a ``data-figure``
    keyed by the page's path."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.page = page
        self.tables: list[str] = []
        self.thead = self.fieldset = 0
        self.hidden: list[bool] = []
        self.skip: str | None = None
        self.text: list[str] | None = None
        self.found: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "data-figure" in attrs:
            self.found.append((self.page, attrs["data-figure"]))
        if tag == "table":
            self.tables.append((attrs.get("class") or "").split()[0] if attrs.get("class") else self.page)
        elif tag == "thead":
            # the admin's app list labels its navigation columns for screen readers only
            self.thead += 0 if "visually-hidden" in (attrs.get("class") or "") else 1
            self.hidden.append("visually-hidden" in (attrs.get("class") or ""))
        elif "sortoptions" in (attrs.get("class") or "").split():
            self.skip = tag  # an admin column's sort priority and links, not its label
        elif tag == "fieldset":
            self.fieldset += 1
        elif (tag == "th" and self.thead) or (tag == "label" and self.fieldset):
            self.text = []

    def handle_endtag(self, tag):
        if tag == "table" and self.tables:
            self.tables.pop()
        elif tag == "thead":
            self.thead -= 0 if self.hidden.pop() else 1
        elif tag == self.skip:
            self.skip = None
        elif tag == "fieldset":
            self.fieldset -= 1
        elif tag in ("th", "label") and self.text is not None:
            label = " ".join("".join(self.text).split()).rstrip(":")
            self.text = None
            key = self.tables[-1] if tag == "th" else self.page
            if label and key not in DATA_TABLES:
                self.found.append((key, label))

    def handle_data(self, data):
        if self.text is not None and self.skip is None:
            self.text.append(data)


def figures(html: str, page: str) -> list[tuple[str, str]]:
    parser = Figures(page)
    parser.feed(html)
    return parser.found


def documented() -> dict[str, set[str]]:
    """The figures docs/dashboard.md explains: per heading's key (the last `code` in a
    ``###`` heading of "What each figure is"), the **bold** labels under it."""
    section = DOC.split("\n## What each figure is\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for block in section.split("\n### ")[1:]:
        heading, _, body = block.partition("\n")
        keys = re.findall(r"`([^`]+)`", heading)
        assert keys, f"docs/dashboard.md: heading {heading!r} names no table or page"
        out[keys[-1]] = set(re.findall(r"\*\*(.+?)\*\*", body))
    return out


def live_js_headers() -> dict[str, list[str]]:
    """The column headers of the tables live.js draws itself, by class."""
    found = re.findall(r'el\("table", \{className: "([\w-]+)"\}, \[\s*el\("thead", null, \[el\("tr", null, '
                       r'\[([^\]]*)\]\.map', LIVE_JS)
    return {cls: json.loads(f"[{items}]") for cls, items in found}


@pytest.fixture
def pages(admin_client, receipts_written):  # noqa: F811
    """Every page with a figure, rendered with something in each of its tables."""
    now = datetime.now(timezone.utc)
    endpoint_row(recent_disconnects=[{"at": 3.0, "name": "worker2", "peer": "127.0.0.1:6666",
                                      "reason": "bad line", "detail": "bad line"}])
    worker_status.save("redis-w1", "redis", True, {("receipts", "master"): 1})
    view = stuck_view()
    view["redis"], view["database"] = {"channel": "hs.test"}, database_view()
    publish("hs.test@host", True, view)
    run = JobRun.objects.create(
        job="check_visibility", status=JobRun.Status.SUCCEEDED, started_at=now - timedelta(seconds=5), ended_at=now,
        rows_in=10, rows_out=0, differences=1, trigger="beat",
        difference_sample=[{"room_id": "!r:hs", "user_id": "@u:hs", "event_id": "$e", "expected": True, "found": False}])
    paths = ["/", "/connections/", "/connections/users/", "/admin/", "/admin/jobs/jobrun/",
             f"/admin/jobs/jobrun/{run.pk}/change/", f"/jobs/{run.pk}/findings"]
    out = {}
    for path in paths:
        response = admin_client.get(path)
        assert response.status_code == 200, path
        out[path.replace(str(run.pk), "<id>")] = response.content.decode()
    out["/metrics"] = admin_client.get("/metrics").content.decode()
    return out


def test_every_figure_on_the_pages_is_documented(pages):
    doc = documented()
    shown = {(key, label) for page, html in pages.items() if page != "/metrics" for key, label in figures(html, page)}
    # what the extraction must see, or it proves nothing
    assert {("live-streams", "Linear"), ("jobs", "Rows in / out"), ("disconnects", "Reason"), ("workers", "Lag per stream"),
            ("syncing-users", "Last sync"), ("/admin/jobs/jobrun/", "Duration (s)"),
            ("/admin/jobs/jobrun/<id>/change/", "First differences"), ("/connections/", "Endpoint counters"),
            ("/", "Facts per second"), ("synapse-streams", "Allocated (unreported)"),
            ("synapse-processes", "Last sign of life"), ("/", "Synapse observer")} <= shown, sorted(shown)
    # the tables live.js draws have the server's headers, so the doc covers both
    js = live_js_headers()
    assert set(js) == {"connections", "disconnects"}, js
    for cls, headers in js.items():
        assert [label for key, label in figures(pages["/connections/"], "/connections/") if key == cls] == headers, cls
    for label in re.findall(r'"data-figure": "([^"]+)"', LIVE_JS):
        assert label in {label for _, label in shown}, label
    missing = sorted((key, label) for key, label in shown if label not in doc.get(key, set()))
    assert not missing, ("figures docs/dashboard.md does not explain (add a **label** line under the heading "
                         f"naming the table or page, in 'What each figure is'): {missing}")


def test_every_metric_is_in_the_docs_metrics_table(pages):
    table = DOC.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(synapse_repl_\w+)`", table))
    served = {s.name for f in text_string_to_metric_families(pages["/metrics"]) for s in f.samples
              if not s.name.endswith("_created")}
    assert {"synapse_repl_process_resident_memory_bytes", "synapse_repl_stream_linear_position",
            "synapse_repl_synapse_unreported_ids_overdue"} <= served, served
    assert not sorted(served - named), f"metrics docs/dashboard.md's table does not name: {sorted(served - named)}"


def test_the_check_catches_an_undocumented_figure(pages):
    html = pages["/"].replace("<th>Linear</th>", "<th>Linear</th><th>Something new</th>")
    shown = figures(html, "/")
    assert ("live-streams", "Something new") in shown
    assert "Something new" not in documented()["live-streams"]
