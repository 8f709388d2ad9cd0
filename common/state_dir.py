"""``STATE_DIR`` is private to the service's user (docs/security.md).

It holds the SQLite database (with the admin's live session keys and the password hashes),
its ``-wal``/``-shm`` files, the generated secret key and replication secret, the generated
admin password, Celery beat's schedule and the locks that keep one demo and one beat per
directory (common/state_lock.py). SQLite creates the WAL and shared-memory files
itself, later and with the process's umask, so chmod after creation cannot cover them: every
process of the service runs with a umask that takes group and other bits away (``0o077``),
set before anything opens the database. The directory is made 0700, and what an older
install left readable in it (directory 0755, its files 0644) is tightened at start-up.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

#: Bits no file the service creates may have: group and others get nothing.
PRIVATE_UMASK = 0o077
#: What the service keeps there (names, or prefixes: the database's -wal/-shm/-journal, the
#: schedule's dbm suffixes). Only these are tightened, so a STATE_DIR set by mistake to a
#: directory holding other things (a checkout) keeps their modes.
STATE_FILES = ("db.sqlite3", "secret_key", "replication_secret", "admin_password", "celerybeat-schedule",
               "demo.lock")


def secure_state_dir(path: Path) -> None:
    """Set the private umask, create ``path`` 0700 and tighten what is already in it.

    Only what this user owns is changed (a shared directory given by mistake is left alone
    rather than failing start-up); a read-only file system is not an error either.
    """
    current = os.umask(PRIVATE_UMASK)
    os.umask(current | PRIVATE_UMASK)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    uid = os.geteuid()
    try:
        _tighten(path, 0o700, uid)
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.name.startswith(STATE_FILES) and entry.is_file(follow_symlinks=False):
                    _tighten(Path(entry.path), 0o600, uid)
    except OSError:
        pass


def _tighten(path: Path, mode: int, uid: int) -> None:
    st = path.stat()
    if st.st_uid == uid and stat.S_IMODE(st.st_mode) & ~mode:
        path.chmod(stat.S_IMODE(st.st_mode) & mode)
