from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SynapseReplConfig(AppConfig):
    name = "synapse_repl"
    verbose_name = _("Service")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Hand the attached Synapse's parts to the dashboard (the two apps share a floor and
        import nothing of each other: docs/architecture.md)."""
        from dashboard.attached_sources import AttachedSource, register
        from synapse_attach import live_status

        register(AttachedSource(
            key="synapse", status_json=live_status.status_json_entries, metrics=live_status.synapse_metrics,
            page_sections=live_status.page_sections, template="dashboard/_synapse_section.html",
            chart_rates=live_status.chart_rates))
