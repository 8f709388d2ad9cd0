"""A child process dies with the process that started it, and takes what it started with it.

The parent makes a pipe and keeps its write end (never inherited: ``os.pipe`` makes it
close-on-exec); each child gets the read end (``pass_fds``), in a session and process group of
its own (``start_new_session``), with the read end's number in ``SYNAPSE_REPL_LIFELINE_FD``.
The child, on start-up (:func:`hold_from_environment`, called from ``synapse_repl/__init__.py``,
which every process of the service imports first), starts a thread that reads it. The kernel
closes the write end when the parent exits, however it exits (``kill -9`` too); the read then
returns end-of-file and the child SIGKILLs its own process group: itself and the processes it
forked (Celery's embedded beat and its pool processes), which stay in that group.

Not ``PR_SET_PDEATHSIG``: it fires when the *thread* that forked the child ends (the supervisor
restarts children from a watcher thread), and it covers the child only. Celery sets it on its
pool processes, but its embedded beat outlives a killed worker.
"""
from __future__ import annotations

import os
import signal
import stat
import sys
import threading
from typing import Mapping

#: The variable that hands a child the read end's descriptor number.
ENV = "SYNAPSE_REPL_LIFELINE_FD"


class Lifeline:
    """The parent's side: one pipe for any number of children. While this process lives (or
    until :meth:`cut`), the children started with :meth:`popen_options` live; after, they kill
    their process groups."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()

    def popen_options(self, env: Mapping[str, str] | None = None) -> dict:
        """What ``subprocess.Popen`` needs for a child on this lifeline: the read end, a
        session of its own, and ``env`` (this process's environment by default) naming the
        descriptor."""
        if self._write < 0:
            raise RuntimeError("this lifeline was cut")
        child_env = dict(os.environ if env is None else env)
        child_env[ENV] = str(self._read)
        return {"pass_fds": (self._read,), "start_new_session": True, "env": child_env}

    def cut(self) -> None:
        """Close both ends: every child still on the lifeline kills its process group."""
        for fd in (self._read, self._write):
            if fd >= 0:
                os.close(fd)
        self._read = self._write = -1

    def __enter__(self) -> "Lifeline":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cut()


def hold_from_environment() -> None:
    """In a child started on a lifeline: watch it from a daemon thread. The variable is taken
    out of the environment, so the processes this one starts do not read a descriptor they
    were not given. Without the variable, nothing happens."""
    value = os.environ.pop(ENV, None)
    if value is None:
        return
    try:
        fd = int(value)
        is_pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
    except (ValueError, OSError):
        is_pipe = False
    if not is_pipe:
        sys.stderr.write(f"{ENV}={value!r} is not an open pipe: this process will not die with its parent\n")
        return
    os.set_inheritable(fd, False)
    threading.Thread(target=_watch, args=(fd,), name="lifeline", daemon=True).start()


def _watch(fd: int) -> None:
    try:
        while os.read(fd, 512):  # the parent never writes: only end-of-file comes
            pass
    except OSError:
        pass
    die_with_group()


def die_with_group() -> None:
    """SIGKILL this process's group if this process leads it (a child started on a lifeline
    does), else only this process: never a group it merely belongs to (its parent's)."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in a child's process group (its own session)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
