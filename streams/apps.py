from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class StreamsConfig(AppConfig):
    name = "streams"
    verbose_name = _("Streams")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Fail at start-up, not at the first write, on a cluster layout the database cannot
        # support (several writers of one stream on SQLite) or the stream does not allow.
        from streams.conf import stream_writers

        stream_writers()
