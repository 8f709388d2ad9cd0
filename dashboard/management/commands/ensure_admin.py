"""``manage.py ensure_admin``: make sure operators can sign in (``make run`` calls it).

Ensures a superuser ``ADMIN_USER`` (default ``admin``). Its password is ``ADMIN_PASSWORD``
when set (applied on every run, so changing the variable changes the password); otherwise it
is generated on first run, printed once and kept in ``STATE_DIR/admin_password`` (mode 0600).
Never a constant in the repository.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


def password_file() -> Path:
    return Path(settings.STATE_DIR) / "admin_password"


def write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (value + "\n").encode())
    finally:
        os.close(fd)


class Command(BaseCommand):
    help = "Ensure the superuser operators sign in with (ADMIN_USER / ADMIN_PASSWORD, else generated)."

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        username = settings.DASHBOARD["ADMIN_USER"]
        if not username:
            raise CommandError("ADMIN_USER is empty; set a user name")
        from_env = os.environ.get("ADMIN_PASSWORD", "")
        user = User.objects.filter(username=username).first()
        if user is None:
            user = User(username=username, is_staff=True, is_superuser=True, is_active=True)
            if from_env:
                user.set_password(from_env)
                user.save()
                self.stdout.write(f"  sign in:  {username} with the password in ADMIN_PASSWORD")
                return
            password = secrets.token_urlsafe(12)
            write_secret(password_file(), password)
            user.set_password(password)
            user.save()
            self.stdout.write(f"  sign in:  {username} / {password}   (generated now and shown this once; "
                              f"kept in {password_file()}; set ADMIN_PASSWORD to choose one)")
            return
        changed = False
        if not (user.is_staff and user.is_superuser and user.is_active):
            user.is_staff = user.is_superuser = user.is_active = True
            changed = True
        if from_env and not user.check_password(from_env):
            user.set_password(from_env)
            changed = True
        if changed:
            user.save()
        if from_env:
            self.stdout.write(f"  sign in:  {username} with the password in ADMIN_PASSWORD")
        elif password_file().exists():
            self.stdout.write(f"  sign in:  {username}, password generated on first run: see {password_file()}")
        else:
            self.stdout.write(f"  sign in:  {username} with the password you gave it")
