"""The operators' dashboard: where every stream stands, live; connections; metrics."""
from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = _("Dashboard")

    def ready(self) -> None:
        from django.contrib import admin

        from dashboard import endpoint_status  # noqa: F401  (publishes endpoint snapshots)

        # The admin index carries the live stream-positions panel.
        admin.site.index_template = "admin/live_index.html"
        admin.site.site_header = _("synapse_repl administration")
        admin.site.site_title = _("synapse_repl admin")
