"""``ensure_admin`` (how operators sign in) and ``demo`` (the embedded default's first look)."""
from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


def ensure_admin() -> str:
    out = io.StringIO()
    call_command("ensure_admin", stdout=out)
    return out.getvalue()


def test_generated_password_is_printed_once_and_kept_private(settings, tmp_path, monkeypatch):
    settings.STATE_DIR = tmp_path
    monkeypatch.delenv("ADMIN_PASSWORD", raising=False)
    first = ensure_admin()
    password = (tmp_path / "admin_password").read_text().strip()
    assert f"admin / {password}" in first
    assert stat.S_IMODE(os.stat(tmp_path / "admin_password").st_mode) == 0o600
    user = get_user_model().objects.get(username="admin")
    assert user.is_staff and user.is_superuser and user.check_password(password)
    second = ensure_admin()
    assert password not in second and str(tmp_path / "admin_password") in second
    # Every checkout gets its own.
    get_user_model().objects.all().delete()
    ensure_admin()
    assert (tmp_path / "admin_password").read_text().strip() != password


def test_password_from_the_environment(settings, tmp_path, monkeypatch):
    settings.STATE_DIR = tmp_path
    monkeypatch.setenv("ADMIN_PASSWORD", "correct horse battery")
    out = ensure_admin()
    assert "correct horse battery" not in out and "ADMIN_PASSWORD" in out
    assert get_user_model().objects.get(username="admin").check_password("correct horse battery")
    assert not (tmp_path / "admin_password").exists()
    monkeypatch.setenv("ADMIN_PASSWORD", "another one entirely")
    ensure_admin()
    assert get_user_model().objects.get(username="admin").check_password("another one entirely")


def test_demo_refuses_full_mode():
    # The test database is PostgreSQL: full mode never gets demo facts.
    with pytest.raises(CommandError, match="only on the embedded default"):
        call_command("demo", "--seed-only")


def test_demo_seeds_an_empty_embedded_database_once(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(STATE_DIR=str(tmp_path), DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")

    def manage(*args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    manage("migrate", "--noinput")
    first = manage("demo", "--seed-only")
    assert "wrote a small dataset (220 facts)" in first
    rooms = int(first.split("demo: persisted ")[1].split()[0])
    assert rooms >= 2000
    second = manage("demo", "--seed-only")
    assert "wrote a small dataset" not in second and "persisted" not in second  # not twice
    count = manage("shell", "-c", "from rooms.models import Event, Room; from streams.models import Receipt; "
                                  "print(Event.objects.count(), Receipt.objects.count(), Room.objects.count())")
    # the generated rooms, and the dataset's 120 events in the demo's own 8 rooms
    assert count.strip().splitlines()[-1].split() == [str(120 + rooms), "60", "28"]
    # the room store answers on SQLite: a member of a demo room gets its timeline
    sync = manage("shell", "-c", "from rooms.storage.reads import initial_sync; "
                                 "from rooms.models import CurrentStateEvent as C; "
                                 "u = C.objects.filter(type='m.room.member', membership='join').first().state_key; "
                                 "print(sum(len(r['timeline']['events']) for r in initial_sync(u)['rooms'].values()))")
    assert int(sync.strip().splitlines()[-1]) > 0
