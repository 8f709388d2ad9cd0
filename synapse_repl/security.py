"""Security settings that need more than one line (docs/security.md).

* :func:`replication_secret`: ``REPLICATION_SECRET`` from the environment or, on SQLite (the
  embedded default, whether ``DATABASE_URL`` is unset or names the file), generated once into
  ``STATE_DIR`` (like the secret key), so that ``make run``, its ``runreplication`` child and a
  ``replication_worker`` started from the same checkout share it without anybody choosing one.
* :func:`require_replication_secret`: a process that would serve replication data without a
  secret refuses to start, saying how to set one.
* :class:`TrustedRootPath`: the ASGI ``root_path`` comes from configuration, never from a
  client (daphne takes it from a ``Daphne-Root-Path`` request header).
* :func:`celery_redis_ssl`: certificate checks for Celery on ``rediss://``.
* :func:`check_replication_secret`: ``manage.py check --deploy`` warns when a full-mode
  cluster leaves the replication HTTP endpoints open.
* :func:`weak_secrets`, :func:`require_strong_secrets`, :func:`check_secret_strength`: a bearer
  secret (``API_TOKEN``, ``REPLICATION_SECRET``) shorter than :data:`MIN_SECRET_LENGTH` stops
  a production web process from starting and is named by ``check --deploy`` in any profile.
"""
from __future__ import annotations

import ssl
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from django.core import checks

from .secret import load_or_create_secret_key

REPLICATION_SECRET_FILE = "replication_secret"


def replication_secret(environ: dict[str, str], state_dir: Path) -> str:
    """The secret every ``/_synapse/replication/`` request must carry ("" = none required).

    Set explicitly: used as is. Unset on SQLite (no ``DATABASE_URL``, or a ``sqlite:`` one):
    read or generated (mode 0600) at ``STATE_DIR/replication_secret``. Unset in full mode
    (PostgreSQL, processes on several hosts): none, and then the web process refuses to start
    (:func:`require_replication_secret`) rather than serve streams to anybody.
    """
    value = environ.get("REPLICATION_SECRET", "")
    if value:
        if "," in value or any(c.isspace() for c in value):
            # A comma would be read as a second header once Django folds repeated headers.
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured("REPLICATION_SECRET must not contain commas or whitespace")
        return value
    database_url = environ.get("DATABASE_URL", "")
    if database_url and not database_url.startswith("sqlite:"):
        return ""
    return load_or_create_secret_key(state_dir / REPLICATION_SECRET_FILE)


HOW_TO_SET_A_SECRET = (
    "REPLICATION_SECRET is not set: this process would serve every stream on "
    "/_synapse/replication/ to anybody who reaches it. Set the same long random string in every "
    "process of the cluster, e.g. export REPLICATION_SECRET=$(python3 -c "
    "'import secrets; print(secrets.token_urlsafe(32))')"
)


def require_replication_secret() -> None:
    """Raise ``ImproperlyConfigured`` (with how to fix it) when no secret is configured."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    if not getattr(settings, "REPLICATION_SECRET", ""):
        raise ImproperlyConfigured(HOW_TO_SET_A_SECRET)


#: Bearer secrets shorter than this can be guessed (``API_TOKEN=a`` was accepted): 32
#: characters of ``secrets.token_urlsafe`` are 192 bits.
MIN_SECRET_LENGTH = 32
BEARER_SECRETS = ("API_TOKEN", "REPLICATION_SECRET")
HOW_TO_MAKE_A_SECRET = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"


def weak_secrets() -> list[str]:
    """One sentence per bearer secret that is set but shorter than :data:`MIN_SECRET_LENGTH`
    (an unset ``API_TOKEN`` means staff sessions only: not weak)."""
    from django.conf import settings

    weak = []
    for name in BEARER_SECRETS:
        value = getattr(settings, name, "") or ""
        if value and len(value) < MIN_SECRET_LENGTH:
            weak.append(f"{name} is {len(value)} characters long, shorter than {MIN_SECRET_LENGTH}")
    return weak


def require_strong_secrets() -> None:
    """In the production profile, raise ``ImproperlyConfigured`` (one line, with the fix) when
    a bearer secret is too short to resist guessing."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    weak = weak_secrets()
    if weak and getattr(settings, "PRODUCTION", False):
        raise ImproperlyConfigured(
            f"{'; '.join(weak)}: the production profile (DJANGO_PROFILE=production) refuses to start "
            f"with a guessable secret. Make one with {HOW_TO_MAKE_A_SECRET}")


class TrustedRootPath:
    """ASGI middleware: every HTTP and WebSocket scope gets the configured ``root_path``.

    Django strips ``root_path`` from the path before URL resolution, so a client able to set
    it (daphne honours a ``Daphne-Root-Path`` request header) could make the path that checks
    see differ from the one that routes. The value is the operator's (``WEB_ROOT_PATH``).
    """

    def __init__(self, app, root_path: str = "") -> None:
        self.app = app
        self.root_path = root_path

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and scope.get("root_path", "") != self.root_path:
            scope = {**scope, "root_path": self.root_path}
        return await self.app(scope, receive, send)


def celery_redis_ssl(redis_url: str) -> dict | None:
    """Celery's ``broker_use_ssl`` for a ``rediss://`` URL (``None`` otherwise).

    redis-py (the channel layer, our bridge and workers) verifies a ``rediss://`` server by
    itself, with ``?ssl_ca_certs=/path`` for a private CA; kombu would *not* verify it unless
    told to, so we tell it, with the same CA.
    """
    parts = urlsplit(redis_url)
    if parts.scheme != "rediss":
        return None
    options: dict = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    ca = parse_qs(parts.query).get("ssl_ca_certs")
    if ca:
        options["ssl_ca_certs"] = ca[0]
    return options


@checks.register(checks.Tags.security, deploy=True)
def check_replication_secret(app_configs, **kwargs) -> list[checks.CheckMessage]:
    from django.conf import settings

    if getattr(settings, "REPLICATION_SECRET", ""):
        return []
    return [checks.Warning(
        "REPLICATION_SECRET is not set: anyone who can reach the web listener can read every "
        "stream through /_synapse/replication/.",
        hint="Set REPLICATION_SECRET to a long random string in every process of the cluster.",
        id="synapse_repl.W001",
    )]


@checks.register(checks.Tags.security, deploy=True)
def check_secret_strength(app_configs, **kwargs) -> list[checks.CheckMessage]:
    return [checks.Warning(f"{sentence}: it can be guessed.",
                           hint=f"Make one with {HOW_TO_MAKE_A_SECRET}", id="synapse_repl.W002")
            for sentence in weak_secrets()]
