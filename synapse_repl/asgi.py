"""ASGI entry point: HTTP through Django; WebSocket for the live dashboard and admin pages
(session auth; same origin only: scheme, host and port, :mod:`dashboard.origin`). The root path
is the operator's, never a client's
(:class:`~synapse_repl.security.TrustedRootPath`), and without a ``REPLICATION_SECRET`` the
application refuses to load: it would serve the replication endpoints to anybody."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synapse_repl.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from dashboard.origin import SameOriginValidator  # noqa: E402
from dashboard.routing import websocket_urlpatterns  # noqa: E402
from synapse_repl.security import (  # noqa: E402
    TrustedRootPath,
    require_replication_secret,
    require_strong_secrets,
)

require_replication_secret()
require_strong_secrets()

application = TrustedRootPath(ProtocolTypeRouter({
    "http": django_asgi_app,
    "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
}), root_path=settings.WEB_ROOT_PATH)

# start-up is over: what it loaded lives as long as the process (synapse_repl/gc_freeze.py)
from synapse_repl.gc_freeze import freeze_long_lived  # noqa: E402

freeze_long_lived()
