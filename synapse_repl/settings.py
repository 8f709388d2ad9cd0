"""Settings, all from environment variables (documented in README.md).

Embedded default: SQLite, the in-memory channel layer, Celery eager, Spark local[*].
Full mode: DATABASE_URL=postgres://..., REDIS_URL=redis://...
"""
from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from common.secret import load_or_create_secret_key
from common.state_dir import secure_state_dir
from jobs.schedules import BeatSchedule, half_an_hour_later
from synapse_repl.security import celery_redis_ssl, replication_secret
from synapse_repl.startup import database_url_problem, redis_url_problem

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("STATE_DIR", BASE_DIR / "var"))
# Before anything creates a file there (SQLite, its WAL, secrets): 0700, files 0600.
secure_state_dir(STATE_DIR)


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def _env_number(name: str, default: float, kind: type = int):
    value = os.environ.get(name, "")
    return kind(value) if value.strip() else default


SECRET_KEY = os.environ.get("SECRET_KEY") or load_or_create_secret_key(STATE_DIR / "secret_key")
DEBUG = _env_bool("DEBUG", False)
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]

INSTALLED_APPS = [
    # (not "daphne": it only adds `runserver`, and would load Twisted into every process;
    # runservice and `python -m daphne` import daphne themselves, before anything else of Twisted)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    # the apps by subsystem, each on the floor above the ones it uses (docs/architecture.md)
    "streams",
    "rooms",
    "replication",
    "jobs",
    "dashboard",
    "synapse_attach",
    "synapse_repl",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # database refusing connections -> 503 with the reason (synapse_repl/errors.py)
    "synapse_repl.errors.DatabaseUnavailableMiddleware",
    "replication.http.replication_secret.ReplicationSecretMiddleware",
    # a NUL byte anywhere in the path, query or form -> 400 (PostgreSQL refuses NUL in text)
    "synapse_repl.errors.RejectNulMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "synapse_repl.urls"
ASGI_APPLICATION = "synapse_repl.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{STATE_DIR / 'db.sqlite3'}"
if database_url_problem(DATABASE_URL):  # one line naming the fix (manage.py), not a traceback
    raise ImproperlyConfigured(database_url_problem(DATABASE_URL))
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # One writer at a time (like Synapse on SQLite): take the write lock at BEGIN so two
    # transactions never deadlock upgrading a read lock, and let readers run beside it (WAL).
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channels -------------------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL and redis_url_problem(REDIS_URL):
    raise ImproperlyConfigured(redis_url_problem(REDIS_URL))
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            # RESP2: redis-py's RESP3 pub/sub path formats every message into a debug log
            # string whatever the log level (measured: the endpoint's top cost).
            "CONFIG": {"hosts": [{"address": REDIS_URL, "protocol": 2}]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# Within one endpoint process, the relay reaches its connections through this in-memory
# layer (line batches never need to leave the process). Capacity and expiry are generous:
# a dropped batch is detected (sequence numbers) and costs the worker a reconnect.
CHANNEL_LAYERS["replication_local"] = {
    "BACKEND": "channels.layers.InMemoryChannelLayer",
    "CONFIG": {"capacity": 100_000, "expiry": 3600},
}

# The dashboard's live feed reaches this process's WebSocket clients through this layer (each
# web process runs its own feed; nothing of it needs to leave the process).
CHANNEL_LAYERS["dashboard_local"] = {"BACKEND": "channels.layers.InMemoryChannelLayer"}

# --- Celery ---------------------------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_BROKER_USE_SSL = celery_redis_ssl(REDIS_URL)  # rediss://: verify the server
CELERY_RESULT_BACKEND = REDIS_URL or None
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery 6's default, set now: its warning about the change took a dozen lines at every outage.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# Batch jobs (jobs): nightly recomputation, hourly consistency checks. Each schedule is
# a crontab "minute hour day-of-month month day-of-week" or an interval "@every 30s" (s, m, h);
# an empty value turns it off.
_RECOMPUTE_CRON = os.environ.get("JOBS_RECOMPUTE_CRON", "0 3 * * *")
_CHECK_CRON = os.environ.get("JOBS_CHECK_CRON", "17 * * * *")
_CHAIN_COVER_CHECK_CRON = os.environ.get("JOBS_CHAIN_COVER_CHECK_CRON", _CHECK_CRON)
JOB_SCHEDULES = {
    "nightly topological ordering": (_RECOMPUTE_CRON, "topological_ordering"),
    "nightly visibility": (half_an_hour_later(_RECOMPUTE_CRON), "visibility"),  # after the orderings
    "hourly ordering check": (_CHECK_CRON, "check_topological_ordering"),
    "hourly visibility check": (_CHECK_CRON, "check_visibility"),
    "hourly chain cover check": (_CHAIN_COVER_CHECK_CRON, "check_chain_cover"),
}
# The audits of an attached Synapse's database (docs/jobs.md, "Synapse audits"), only with
# SYNAPSE_DATABASE_URL: its forward extremities hourly (the metric and alert follow them), the
# other audits on JOBS_SYNAPSE_AUDIT_CRON (default off: each reads whole tables).
if os.environ.get("SYNAPSE_DATABASE_URL"):
    _SYNAPSE_AUDIT_CRON = os.environ.get("JOBS_SYNAPSE_AUDIT_CRON", "")
    JOB_SCHEDULES.update({
        "hourly Synapse forward extremities": (os.environ.get("JOBS_SYNAPSE_EXTREMITIES_CRON", "43 * * * *"),
                                               "synapse_forward_extremities"),
        "Synapse orderings audit": (_SYNAPSE_AUDIT_CRON, "synapse_check_orderings"),
        "Synapse state group health": (_SYNAPSE_AUDIT_CRON, "synapse_state_group_health"),
        "Synapse chain cover audit": (_SYNAPSE_AUDIT_CRON, "synapse_check_chain_cover"),
        "Synapse state audit": (_SYNAPSE_AUDIT_CRON, "synapse_check_state"),
    })
CELERY_BEAT_SCHEDULE = BeatSchedule(JOB_SCHEDULES)  # made when beat or the jobs panel first reads it
#: More job definitions: comma-separated modules, each naming its jobs in a module-level
#: ``JOBS = {"name": function}`` (imported wherever jobs are listed or run; docs/jobs.md).
JOB_MODULES = [m.strip() for m in os.environ.get("JOB_MODULES", "").split(",") if m.strip()]

# --- /health/ready (dashboard/health.py) ------------------------------------------------
# Readiness also requires this host's replication endpoint (REPLICATION_LISTEN) to be running,
# and, with Redis, a Celery worker answering; 0 leaves either out (a web-only process).
HEALTH_CHECK_ENDPOINT = os.environ.get("HEALTH_CHECK_ENDPOINT", "1") != "0"
HEALTH_CHECK_CELERY = os.environ.get("HEALTH_CHECK_CELERY", "1") != "0"

# --- This process and its cluster -----------------------------------------------------------
# Bearer token for the read-only /api/ endpoints (empty: staff sessions only).
API_TOKEN = os.environ.get("API_TOKEN", "")

SYNAPSE_REPL = {
    # The writer name of this process (Synapse's worker_name / instance_name).
    "INSTANCE_NAME": os.environ.get("INSTANCE_NAME", "master"),
    "SERVER_NAME": os.environ.get("SERVER_NAME", "localhost"),
    "REPLICATION_LISTEN": os.environ.get("REPLICATION_LISTEN", "127.0.0.1:9092"),
    "WEB_LISTEN": os.environ.get("WEB_LISTEN", "127.0.0.1:8000"),
    "SPARK_MASTER": os.environ.get("SPARK_MASTER", "") or "local[*]",
    # Job children (``run_job``, each with a JVM) the dashboard may have alive at once on this
    # host, all jobs together; a start beyond it is refused before anything is spawned.
    "JOBS_MAX_CHILDREN": _env_number("JOBS_MAX_CHILDREN", 2),
    # A running job's process rewrites its run's heartbeat every second or so; a run on another
    # host whose heartbeat is older than this is marked failed ("interrupted") by the sweep
    # (jobs/liveness.py). Runs on this host are judged by their pid at once.
    "JOBS_HEARTBEAT_STALE_SECONDS": _env_number("JOBS_HEARTBEAT_STALE_SECONDS", 120, float),
    # How often runservice sweeps for runs whose process is gone.
    "JOBS_SWEEP_SECONDS": _env_number("JOBS_SWEEP_SECONDS", 5, float),
    # "events=master,worker1;receipts=master": who may write each stream (default: master).
    "STREAM_WRITERS": os.environ.get("STREAM_WRITERS", ""),
    # How often an endpoint re-reads stream_positions for advances it was not told about.
    "POSITION_POLL_SECONDS": float(os.environ.get("POSITION_POLL_SECONDS", "1.0")),
    # Embedded default (SQLite, no Redis): how often the endpoint reads the rows other local
    # processes committed (write_facts in another shell, the demo) and sends them as RDATA.
    "LOCAL_SCAN_SECONDS": _env_number("LOCAL_SCAN_SECONDS", 0.2, float),
    # A reserved stream ID pending longer than this many seconds is reported as stuck.
    "STUCK_AFTER_SECONDS": float(os.environ.get("STUCK_AFTER_SECONDS", "30")),
    # -- hardening: who may connect, and how much (docs/security.md) ------------------------
    # TCP peers outside these networks are closed before any byte is sent.
    "REPLICATION_ALLOWED_NETWORKS": os.environ.get("REPLICATION_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128"),
    "REPLICATION_TLS_CERT": os.environ.get("REPLICATION_TLS_CERT", ""),
    "REPLICATION_TLS_KEY": os.environ.get("REPLICATION_TLS_KEY", ""),
    "REPLICATION_TLS_CA": os.environ.get("REPLICATION_TLS_CA", ""),
    "REPLICATION_TLS": _env_bool("REPLICATION_TLS", False),
    "REPLICATION_MAX_CONNECTIONS": _env_number("REPLICATION_MAX_CONNECTIONS", 1000),
    "REPLICATION_MAX_CONNECTIONS_PER_ADDRESS": _env_number("REPLICATION_MAX_CONNECTIONS_PER_ADDRESS", 200),
    "REPLICATION_COMMAND_RATE": _env_number("REPLICATION_COMMAND_RATE", 1000.0, float),
    "REPLICATION_COMMAND_BURST": _env_number("REPLICATION_COMMAND_BURST", 5000),
    "REPLICATION_MAX_PENDING_COMMANDS": _env_number("REPLICATION_MAX_PENDING_COMMANDS", 10_000),
    # A TCP peer must send REPLICATE within this many seconds, and finish any line it starts.
    "REPLICATION_HANDSHAKE_TIMEOUT": _env_number("REPLICATION_HANDSHAKE_TIMEOUT", 30.0, float),
    "REPLICATION_LINE_TIMEOUT": _env_number("REPLICATION_LINE_TIMEOUT", 30.0, float),
    # The endpoint logs when its event loop wakes up this many milliseconds late (every connection waited).
    "REPLICATION_LOOP_LAG_WARN_MS": _env_number("REPLICATION_LOOP_LAG_WARN_MS", 100.0, float),
    # Legacy REPLICATE history pages (500 rows) one endpoint reads per second, all connections together.
    "REPLICATION_HISTORY_PAGE_RATE": _env_number("REPLICATION_HISTORY_PAGE_RATE", 10.0, float),
    # State peers create: USER_SYNC pairs per connection and in all, USER_IP users kept.
    "REPLICATION_MAX_SYNCING_USERS_PER_CONNECTION": _env_number("REPLICATION_MAX_SYNCING_USERS_PER_CONNECTION", 10_000),
    "REPLICATION_MAX_SYNCING_USERS": _env_number("REPLICATION_MAX_SYNCING_USERS", 50_000),
    "REPLICATION_MAX_USER_IPS": _env_number("REPLICATION_MAX_USER_IPS", 10_000),
    # Kernel send buffer per TCP connection, bytes (0: the kernel's autotuning, up to 4 MiB).
    "REPLICATION_SEND_BUFFER_BYTES": _env_number("REPLICATION_SEND_BUFFER_BYTES", 0),
    "REPLICATION_CATCHUP_MAX_RANGE": _env_number("REPLICATION_CATCHUP_MAX_RANGE", 1_000_000),
    "REPLICATION_CATCHUP_MAX_LIMIT": _env_number("REPLICATION_CATCHUP_MAX_LIMIT", 1000),
    # "w1=http://10.0.0.1:8000,w2=http://...": where a worker fetches each writer's catch-up
    # (Synapse's instance_map); writers not named: the worker's --catchup-url.
    "REPLICATION_INSTANCE_MAP": os.environ.get("REPLICATION_INSTANCE_MAP", ""),
    # How often an endpoint writes the USER_IP sightings it collected to user_ips (Synapse: 5 s).
    "USER_IP_FLUSH_SECONDS": _env_number("USER_IP_FLUSH_SECONDS", 5.0, float),
    # With Redis: one endpoint at a time records the USER_IP published on Redis, holding a
    # lease of this many seconds in Redis (renewed every third of it): how long sightings go
    # unrecorded after the holder dies without releasing it (redis_user_ips.py).
    "USER_IP_LEASE_SECONDS": _env_number("USER_IP_LEASE_SECONDS", 15.0, float),
}

if SYNAPSE_REPL["JOBS_MAX_CHILDREN"] < 1:
    raise ImproperlyConfigured(f"JOBS_MAX_CHILDREN={SYNAPSE_REPL['JOBS_MAX_CHILDREN']}: expected 1 or more")

# --- Operators' dashboard, admin and metrics (docs/dashboard.md) -----------------------------
DASHBOARD = {
    # The superuser `make run` ensures (password: ADMIN_PASSWORD, else generated once).
    "ADMIN_USER": os.environ.get("ADMIN_USER", "admin"),
    # Addresses allowed to read /metrics without signing in: "127.0.0.1/32,10.0.0.0/8".
    "METRICS_ALLOWED_NETWORKS": os.environ.get("METRICS_ALLOWED_NETWORKS", ""),
    # How often the live feed refreshes (and samples facts/s) while pages are open.
    "FEED_REFRESH_SECONDS": float(os.environ.get("FEED_REFRESH_SECONDS", "1.0")),
    # Demo dataset and trickle on the embedded default (never in full mode).
    "DEMO": _env_bool("DEMO", True),
}

# --- Attaching read-only to a live Synapse (docs/attach.md) ---------------------------------
# Synapse's databases are never Django databases (no migration or ORM write can reach them):
# synapse_attach opens its own connections, read-only (default_transaction_read_only=on).
SYNAPSE_ATTACH = {
    # Synapse's main database, as a role with SELECT only: postgres://observer:...@host/synapse.
    "DATABASE_URL": os.environ.get("SYNAPSE_DATABASE_URL", ""),
    # Its state database, when Synapse keeps state_groups* apart (data_stores: ["state"]).
    "STATE_DATABASE_URL": os.environ.get("SYNAPSE_STATE_DATABASE_URL", ""),
    # Synapse's Redis and its channel prefix (its server_name).
    "REDIS_URL": os.environ.get("SYNAPSE_REDIS_URL", ""),
    "SERVER_NAME": os.environ.get("SYNAPSE_SERVER_NAME", ""),
    # A writer behind another writer of its stream for this long is called stuck.
    "STUCK_AFTER_SECONDS": _env_number("SYNAPSE_STUCK_AFTER_SECONDS", 10.0, float),
    # A sequence ID handed out and reported persisted by no writer for this long is overdue.
    "UNREPORTED_AFTER_SECONDS": _env_number("SYNAPSE_UNREPORTED_AFTER_SECONDS", 60.0, float),
    # How often the observer reads Synapse's database (one snapshot per read, in its own process).
    "DATABASE_INTERVAL_SECONDS": _env_number("SYNAPSE_DATABASE_INTERVAL_SECONDS", 5.0, float),
    # Every statement on Synapse's database is cancelled after this many seconds.
    "STATEMENT_TIMEOUT_SECONDS": _env_number("SYNAPSE_STATEMENT_TIMEOUT_SECONDS", 10.0, float),
    "CONNECT_TIMEOUT_SECONDS": _env_number("SYNAPSE_CONNECT_TIMEOUT_SECONDS", 5, int),
    # synapse_forward_extremities lists the rooms with more forward extremities than this
    # (Synapse's own dummy_events_threshold, default 10).
    "EXTREMITY_THRESHOLD": _env_number("SYNAPSE_EXTREMITY_THRESHOLD", 10, int),
}

# --- Security (docs/security.md) -------------------------------------------------------------
# Required as "Authorization: Bearer <secret>" on /_synapse/replication/; "" (full mode, unset):
# the web process refuses to start (synapse_repl/security.py).
REPLICATION_SECRET = replication_secret(os.environ, STATE_DIR)
# The path prefix a reverse proxy serves the web UI under ("" = the root). Only ever from here:
# a client's Daphne-Root-Path header is ignored (security.TrustedRootPath).
WEB_ROOT_PATH = os.environ.get("WEB_ROOT_PATH", "").rstrip("/")
if WEB_ROOT_PATH and not WEB_ROOT_PATH.startswith("/"):
    raise ImproperlyConfigured(f"WEB_ROOT_PATH={WEB_ROOT_PATH!r}: expected a path such as /synapse_repl")
# The /api/ app caps its page sizes (?limit=) at this many items.
API_MAX_LIMIT = _env_number("API_MAX_LIMIT", 1000)
AUTHENTICATION_BACKENDS = ["common.login_throttle.ThrottledModelBackend"]
LOGIN_MAX_FAILURES = _env_number("LOGIN_MAX_FAILURES", 5)
LOGIN_FAILURE_WINDOW_SECONDS = _env_number("LOGIN_FAILURE_WINDOW_SECONDS", 300)
# Wrong bearer tokens (API_TOKEN, REPLICATION_SECRET) per client address: beyond this many in
# the window, 429 with Retry-After (common/bearer_throttle.py); 0 turns it off.
BEARER_MAX_FAILURES = _env_number("BEARER_MAX_FAILURES", 10)
BEARER_FAILURE_WINDOW_SECONDS = _env_number("BEARER_FAILURE_WINDOW_SECONDS", 300)
# DJANGO_PROFILE=production: served over HTTPS (directly or behind a proxy that sets
# X-Forwarded-Proto, with SECURE_PROXY_SSL_HEADER=on): secure cookies, HSTS, redirect to HTTPS.
# Each knob can be set on its own too. `manage.py check --deploy` is clean in this profile.
PRODUCTION = os.environ.get("DJANGO_PROFILE", "").strip().lower() == "production"
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _env_bool("SECURE_COOKIES", PRODUCTION)
SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT", PRODUCTION)
# Workers reach the catch-up endpoint on a private network, perhaps in plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^_synapse/replication/"]
SECURE_HSTS_SECONDS = _env_number("SECURE_HSTS_SECONDS", 31_536_000 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", PRODUCTION)
SECURE_HSTS_PRELOAD = _env_bool("SECURE_HSTS_PRELOAD", PRODUCTION)
if _env_bool("SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# --- The rest is standard Django -------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
# One time format with the zone on every page (synapse_repl/formats/en/formats.py); the live
# pages' script formats the same way (static/dashboard/live.js, clock()).
FORMAT_MODULE_PATH = ["synapse_repl.formats"]
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = STATE_DIR / "staticfiles"
LOGIN_URL = "/admin/login/"
# The debug error page masks URL passwords in the settings it shows, too.
DEFAULT_EXCEPTION_REPORTER_FILTER = "common.url_redaction.RedactingExceptionReporterFilter"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Every line goes through redaction: no URL's password reaches a log (docs/security.md).
    "formatters": {"plain": {"()": "common.url_redaction.RedactingFormatter",
                             "format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}
