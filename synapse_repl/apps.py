"""The composition root's start-up: once every app is loaded and has declared its streams, hand
the stream runtime the parts that live on higher floors, then check the cluster layout."""
from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SynapseReplConfig(AppConfig):
    name = "synapse_repl"
    verbose_name = _("Service")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # deferred: these modules import models, importable only once apps are loaded
        from replication.publish.streamer import ReplicationStreamer
        from replication.typing_stream import TypingWriter
        from streams.conf import stream_writers
        from streams.runtime import RuntimeParts, provide_parts

        provide_parts(RuntimeParts(typing_writer=TypingWriter, streamer=ReplicationStreamer))
        # Fail at start-up, not at the first write, on a cluster layout the database cannot
        # support (several writers of one stream on SQLite) or the stream does not allow.
        stream_writers()
