from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RoomsConfig(AppConfig):
    name = "rooms"
    verbose_name = _("Rooms")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # deferred: the declarations name this app's models, importable only once apps are loaded
        from rooms.event_streams import declare_event_streams

        declare_event_streams()
