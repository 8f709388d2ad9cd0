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
* :func:`secret_weakness`, :func:`weak_secrets`, :func:`require_strong_secrets`,
  :func:`check_secret_strength`: a guessable bearer secret (``API_TOKEN``,
  ``REPLICATION_SECRET``: shorter than :data:`MIN_SECRET_LENGTH`, a pattern repeated, too small an
  alphabet for its length, too few distinct characters) stops a production web process from
  starting and is named by ``check --deploy`` in any profile.
"""
from __future__ import annotations

import math
import ssl
import string
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from django.core import checks

from common.secret import load_or_create_secret_key

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
#: What the characters used could make at most (length x log2 of the alphabet they come
#: from): 32 digits are 106 bits, 32 hex digits 128, 32 lowercase letters 150.
MIN_SECRET_ALPHABET_BITS = 128
#: What the characters' frequencies show (length x their Shannon entropy): a random 32-hex
#: secret measured 92 bits at the least over 100,000 draws, ``"a" * 31 + "b"`` 6.
MIN_SECRET_SPREAD_BITS = 64
BEARER_SECRETS = ("API_TOKEN", "REPLICATION_SECRET")
HOW_TO_MAKE_A_SECRET = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"

_LOWER, _UPPER, _DIGITS = set(string.ascii_lowercase), set(string.ascii_uppercase), set(string.digits)


def alphabet(value: str) -> tuple[str, int]:
    """The smallest usual alphabet ``value``'s characters come from: (its name, its size)."""
    chars = set(value)
    if chars <= _DIGITS:
        return "digits", 10
    if chars <= _DIGITS | set("abcdef") or chars <= _DIGITS | set("ABCDEF"):
        return "hex digits", 16
    classes = [(name, size) for name, members, size in (
        ("lowercase letters", _LOWER, 26), ("uppercase letters", _UPPER, 26), ("digits", _DIGITS, 10))
        if chars & members]
    if chars - _LOWER - _UPPER - _DIGITS:
        classes.append(("other characters", 33))
    return " and ".join(name for name, _ in classes), sum(size for _, size in classes)


def repeated_runs(value: str) -> tuple[int, int]:
    """(distinct 3-character runs in ``value``, runs in all): a secret made of a pattern
    repeated, even with something added, has few distinct ones."""
    runs = [value[i:i + 3] for i in range(len(value) - 2)]
    return len(set(runs)), len(runs)


def spread_bits(value: str) -> float:
    """Length x the Shannon entropy of ``value``'s character frequencies."""
    n = len(value)
    return -sum(c * math.log2(c / n) for c in Counter(value).values()) if n else 0.0


def secret_weakness(value: str) -> str | None:
    """Why ``value`` is too easy to guess as a bearer secret, as the end of a sentence
    ("is 8 characters long, ..."), or ``None``: too short, a pattern repeated, characters
    from too small an alphabet for its length, or too few distinct ones."""
    n = len(value)
    if n < MIN_SECRET_LENGTH:
        return f"is {n} characters long, shorter than {MIN_SECRET_LENGTH}"
    distinct, runs = repeated_runs(value)
    if distinct * 4 < runs * 3:  # fewer than three in four distinct
        return f"repeats a pattern (only {distinct} distinct 3-character runs of {runs})"
    name, size = alphabet(value)
    bits = n * math.log2(size)
    if bits < MIN_SECRET_ALPHABET_BITS:
        return (f"is {n} {name} (at most {bits:.0f} bits; {MIN_SECRET_ALPHABET_BITS} needed: "
                f"{math.ceil(MIN_SECRET_ALPHABET_BITS / math.log2(size))} of them, or mixed characters)")
    spread = spread_bits(value)
    if spread < MIN_SECRET_SPREAD_BITS:
        return (f"repeats its characters ({len(set(value))} distinct in {n}: about {spread:.0f} bits, "
                f"fewer than {MIN_SECRET_SPREAD_BITS})")
    return None


def weak_secrets() -> list[str]:
    """One sentence per bearer secret that is set but guessable (:func:`secret_weakness`; an
    unset ``API_TOKEN`` means staff sessions only: not weak). The secret itself is never in it."""
    from django.conf import settings

    weak = []
    for name in BEARER_SECRETS:
        value = getattr(settings, name, "") or ""
        problem = secret_weakness(value) if value else None
        if problem:
            weak.append(f"{name} {problem}")
    return weak


def require_strong_secrets() -> None:
    """In the production profile, raise ``ImproperlyConfigured`` (one line, with the fix) when
    a bearer secret is guessable."""
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
