"""SECRET_KEY handling: from the environment, else generated once and kept in a local file."""
from __future__ import annotations

import os
import secrets
from pathlib import Path


def load_or_create_secret_key(path: Path) -> str:
    """Return the key stored at ``path``, creating it (mode 0600) on first use.

    The key is never a constant in the repository: each checkout gets its own.
    """
    try:
        key = path.read_text().strip()
        if key:
            return key
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race: use its key
        return path.read_text().strip()
    try:
        os.write(fd, key.encode())
    finally:
        os.close(fd)
    return key
