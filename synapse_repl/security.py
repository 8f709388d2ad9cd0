"""Security settings that need more than one line (docs/security.md).

* :func:`replication_secret`: ``REPLICATION_SECRET`` from the environment or, on the embedded
  default, generated once into ``STATE_DIR`` (like the secret key), so that ``make run``, its
  ``runreplication`` child and a ``replication_worker`` started from the same checkout share
  it without anybody choosing one.
* :func:`celery_redis_ssl`: certificate checks for Celery on ``rediss://``.
* :func:`check_replication_secret`: ``manage.py check --deploy`` warns when a full-mode
  cluster leaves the replication HTTP endpoints open.
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

    Set explicitly: used as is. Unset on the embedded default (no ``DATABASE_URL``): read or
    generated (mode 0600) at ``STATE_DIR/replication_secret``. Unset in full mode: none, as in
    Synapse; ``check --deploy`` says so.
    """
    value = environ.get("REPLICATION_SECRET", "")
    if value:
        if "," in value or any(c.isspace() for c in value):
            # A comma would be read as a second header once Django folds repeated headers.
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured("REPLICATION_SECRET must not contain commas or whitespace")
        return value
    if environ.get("DATABASE_URL"):
        return ""
    return load_or_create_secret_key(state_dir / REPLICATION_SECRET_FILE)


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
