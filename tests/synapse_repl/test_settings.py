"""Settings come from the environment; the secret key is never a constant."""
import os
import subprocess
import sys
from pathlib import Path

from common.secret import load_or_create_secret_key

ROOT = Path(__file__).resolve().parents[2]


def test_secret_key_generated_once_and_kept(tmp_path):
    path = tmp_path / "state" / "secret_key"
    first = load_or_create_secret_key(path)
    assert len(first) >= 50
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert load_or_create_secret_key(path) == first
    assert load_or_create_secret_key(tmp_path / "other") != first


def settings_in_subprocess(env: dict[str, str], expr: str) -> str:
    code = (f"import django, os; os.environ['DJANGO_SETTINGS_MODULE']='synapse_repl.settings'; django.setup(); "
            f"from django.conf import settings; print(repr(({expr})))")
    base = {"PATH": os.environ["PATH"]}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**base, **env},
                            capture_output=True, text=True, check=True)
    return result.stdout.strip()


def test_embedded_default(tmp_path):
    out = settings_in_subprocess(
        {"STATE_DIR": str(tmp_path)},
        "settings.DATABASES['default']['ENGINE'], settings.CHANNEL_LAYERS['default']['BACKEND'], "
        "settings.CELERY_TASK_ALWAYS_EAGER, settings.SYNAPSE_REPL['INSTANCE_NAME'], "
        "settings.SYNAPSE_REPL['REPLICATION_LISTEN'], settings.SYNAPSE_REPL['WEB_LISTEN'], "
        "settings.SYNAPSE_REPL['SPARK_MASTER']",
    )
    assert out == ("('django.db.backends.sqlite3', 'channels.layers.InMemoryChannelLayer', True, 'master', "
                   "'127.0.0.1:9092', '127.0.0.1:8000', 'local[*]')")
    assert (tmp_path / "secret_key").exists()


def test_full_mode_from_environment(tmp_path):
    out = settings_in_subprocess(
        {"STATE_DIR": str(tmp_path), "DATABASE_URL": "postgres://u:p@db.example:5433/hs",
         "REDIS_URL": "redis://127.0.0.1:6390/0", "INSTANCE_NAME": "worker1", "SERVER_NAME": "example.com",
         "SECRET_KEY": "from-env", "SPARK_MASTER": "spark://h:7077"},
        "settings.DATABASES['default']['ENGINE'], settings.DATABASES['default']['PORT'], "
        "settings.CHANNEL_LAYERS['default']['BACKEND'], settings.CELERY_TASK_ALWAYS_EAGER, "
        "settings.CELERY_BROKER_URL, settings.SYNAPSE_REPL['INSTANCE_NAME'], settings.SYNAPSE_REPL['SERVER_NAME'], "
        "settings.SECRET_KEY, settings.SYNAPSE_REPL['SPARK_MASTER']",
    )
    assert out == ("('django.db.backends.postgresql', 5433, 'channels_redis.pubsub.RedisPubSubChannelLayer', "
                   "False, 'redis://127.0.0.1:6390/0', 'worker1', 'example.com', 'from-env', 'spark://h:7077')")
    assert not (tmp_path / "secret_key").exists()
