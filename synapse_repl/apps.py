"""The composition root's start-up: once every app is loaded and has declared its streams, hand
the stream runtime the parts that live on higher floors, check the cluster layout, and hand the
dashboard the attached Synapse's status, metrics and page section."""
from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


def replication_streamer(*args, **kwargs):
    """The replication app's ``ReplicationStreamer``, built for a process that publishes."""
    # deferred: the streamer and redis-py under it (0.17 s of imports) load only in a process
    # that publishes, not in every process Django starts (checks, migrate, one-off commands)
    from replication.publish.streamer import ReplicationStreamer

    return ReplicationStreamer(*args, **kwargs)


def typing_writer(*args, **kwargs):
    """The replication app's ``TypingWriter``, built for a process that writes typing."""
    # deferred: the writer and the wire protocol under it (msgspec) load only in a process
    # that writes typing, not in every process Django starts
    from replication.typing_stream import TypingWriter

    return TypingWriter(*args, **kwargs)


class SynapseReplConfig(AppConfig):
    name = "synapse_repl"
    verbose_name = _("Service")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # deferred: these modules import models, importable only once apps are loaded
        from dashboard.attached_sources import AttachedSource, register
        from streams.conf import stream_writers
        from streams.runtime import RuntimeParts, provide_parts
        from synapse_attach import live_status

        provide_parts(RuntimeParts(typing_writer=typing_writer, streamer=replication_streamer))
        # Fail at start-up, not at the first write, on a cluster layout the database cannot
        # support (several writers of one stream on SQLite) or the stream does not allow.
        stream_writers()
        # the attached Synapse's parts, handed to the dashboard (docs/architecture.md)
        register(AttachedSource(
            key="synapse", status_json=live_status.status_json_entries, metrics=live_status.synapse_metrics,
            page_sections=live_status.page_sections, template="dashboard/_synapse_section.html",
            chart_rates=live_status.chart_rates))
