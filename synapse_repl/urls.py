from functools import partial

from django.contrib import admin
from django.contrib.staticfiles.views import serve as serve_static
from django.urls import include, path, re_path

from common.login_throttle import ThrottledAdminAuthenticationForm
from dashboard import health
from dashboard.metrics import counting_catchups
from replication.http.catchup import get_repl_stream_updates, without_txn_id
from replication.http.typing_changes import set_typing

# A database that refuses connections answers 503 with the reason, wherever it failed.
handler500 = "synapse_repl.errors.server_error"

# A throttled login is told so, and for how long (not "enter a correct username and password").
admin.site.login_form = ThrottledAdminAuthenticationForm

# Catch-up requests are counted for /metrics.
get_repl_stream_updates = counting_catchups(get_repl_stream_updates)

urlpatterns = [
    path("admin/", admin.site.urls),
    # Unauthenticated probes (load balancers, Kubernetes): ok/failing per part, nothing more.
    path("health/live", health.live_view, name="health-live"),
    path("health/ready", health.ready_view, name="health-ready"),
    path("api/", include("rooms.api.urls")),
    # Synapse's form carries a transaction ID as the last segment; without it: 404, as Synapse.
    path("_synapse/replication/get_repl_stream_updates/<str:stream_name>/",
         without_txn_id, name="repl-stream-updates-without-txn"),
    path("_synapse/replication/get_repl_stream_updates/<str:stream_name>/<str:txn_id>",
         get_repl_stream_updates, name="repl-stream-updates-txn"),
    # Typing changes for the typing writer (in memory: this process, when it is the writer).
    path("_synapse/replication/typing", set_typing, name="repl-typing"),
    # One process serves its own few static files (admin and dashboard assets); no separate
    # web server or collectstatic step is needed to run it.
    re_path(r"^static/(?P<path>.*)$", partial(serve_static, insecure=True)),
    # Browsers ask every site for /favicon.ico: answer it instead of a 404 on every page.
    path("favicon.ico", partial(serve_static, path="dashboard/favicon.ico", insecure=True)),
    path("", include("dashboard.urls")),
]
