"""A child dies with its parent, and takes what it started with it (common/lifeline.py).

Real processes throughout: a parent started here (in a session of its own) starts children on
a lifeline; the test SIGKILLs the parent and polls /proc until nothing of its tree is left.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testing.process_tree import alive, descendants, kill_all, wait_all_gone

ROOT = Path(__file__).resolve().parents[2]

#: A child on a lifeline: watches it, starts a grandchild by fork+exec and one by fork alone
#: (as Celery's pool and beat are), says so on stdout, then sleeps.
CHILD = """
import os, subprocess, sys, time
import synapse_repl  # takes the lifeline (synapse_repl/__init__.py)
exec_child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
fork_child = os.fork()
if fork_child == 0:
    time.sleep(120)
    os._exit(0)
print("ready", flush=True)
time.sleep(120)
"""


def start_parent(code: str, tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "parent.err", "wb"), text=True)


def wait_tree(parent: subprocess.Popen, size: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while len(tree := descendants(parent.pid)) < size:
        assert parent.poll() is None and time.monotonic() < deadline, tree
        time.sleep(0.1)
    return tree


def finish(parent: subprocess.Popen, tree: dict) -> None:
    """Clean-up, whatever the test found: the parent's group and every process of its tree."""
    kill_all(tree)
    try:
        os.killpg(parent.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    parent.wait()


def test_a_killed_parent_takes_its_child_and_the_childs_children_with_it(tmp_path):
    code = ("import subprocess, sys, time\n"
            "from common.lifeline import Lifeline\n"
            "line = Lifeline()\n"
            f"subprocess.Popen([sys.executable, '-c', {CHILD!r}], **line.popen_options())\n"
            "time.sleep(120)\n")
    parent = start_parent(code, tmp_path)
    tree: dict = {}
    try:
        assert parent.stdout.readline() == "ready\n", (tmp_path / "parent.err").read_text()
        tree = wait_tree(parent, 3)  # the child, its exec'd child and its forked child
        os.kill(parent.pid, signal.SIGKILL)
        assert wait_all_gone(tree) == {}
    finally:
        finish(parent, tree)


def test_children_restarted_from_the_supervisors_thread_die_with_it_too(tmp_path):
    """The supervisor restarts a child from its watcher thread, not the main thread: the
    lifeline is the process's, so the restarted child dies with the process all the same."""
    code = ("import sys, time\n"
            "from synapse_repl.supervisor import RestartPolicy, Supervisor\n"
            "sup = Supervisor(on_fatal=print, poll=0.05)\n"
            f"sup.add('child', [sys.executable, '-c', {CHILD!r}], policy=RestartPolicy(first_delay=0.05))\n"
            "sup.start()\n"
            "time.sleep(120)\n")
    parent = start_parent(code, tmp_path)
    tree: dict = {}
    try:
        assert parent.stdout.readline() == "ready\n", (tmp_path / "parent.err").read_text()
        first = wait_tree(parent, 3)
        tree.update(first)
        (child_pid, child_started), = [p for p in first if Path(f"/proc/{p[0]}/status").read_text()
                                       .split("PPid:")[1].split()[0] == str(parent.pid)]
        os.kill(child_pid, signal.SIGKILL)  # the supervisor kills what it left and restarts it
        assert wait_all_gone(first) == {}
        assert parent.stdout.readline() == "ready\n"
        second = wait_tree(parent, 3)
        tree.update(second)
        assert not set(second) & set(first)
        os.kill(parent.pid, signal.SIGKILL)
        assert wait_all_gone(second) == {}
    finally:
        finish(parent, tree)


def test_cutting_the_lifeline_ends_the_children(tmp_path):
    code = ("import subprocess, sys, time\n"
            "from common.lifeline import Lifeline\n"
            "line = Lifeline()\n"
            f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}], **line.popen_options())\n"
            "input()\n"
            "line.cut()\n"
            "print(child.wait(), flush=True)\n"
            "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, start_new_session=True, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    tree: dict = {}
    try:
        assert parent.stdout.readline() == "ready\n"
        tree = wait_tree(parent, 3)
        parent.stdin.write("\n")
        parent.stdin.flush()
        assert parent.stdout.readline() == f"{-signal.SIGKILL}\n"
        assert wait_all_gone(tree) == {}
        assert parent.poll() is None  # the parent itself goes on
    finally:
        finish(parent, tree)


def test_a_child_that_does_not_lead_its_group_kills_only_itself(tmp_path):
    """A process given a lifeline but left in its parent's process group never kills that
    group (its parent's other children, or the shell's job)."""
    code = ("import os, subprocess, sys, time\n"
            "from common.lifeline import ENV\n"
            "r, w = os.pipe()\n"
            "sibling = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import synapse_repl, time; print(\"ready\", flush=True); "
            "time.sleep(120)'], pass_fds=(r,), env={**os.environ, ENV: str(r)})\n"
            "time.sleep(120)\n")
    parent = start_parent(code, tmp_path)
    tree: dict = {}
    try:
        assert parent.stdout.readline() == "ready\n", (tmp_path / "parent.err").read_text()
        tree = wait_tree(parent, 2)
        child = next(p for p, cmd in tree.items() if "synapse_repl" in cmd)
        sibling = next(p for p in tree if p != child)
        os.kill(parent.pid, signal.SIGKILL)
        assert wait_all_gone({child: ""}) == {}
        time.sleep(0.5)
        assert alive(sibling)
    finally:
        finish(parent, tree)


def test_a_lifeline_variable_without_a_pipe_is_said_and_not_passed_on(tmp_path):
    env = {**os.environ, "SYNAPSE_REPL_LIFELINE_FD": "97"}
    code = "import os, synapse_repl; print(os.environ.get('SYNAPSE_REPL_LIFELINE_FD'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout == "None\n", done.stderr
    assert done.stderr == ("SYNAPSE_REPL_LIFELINE_FD='97' is not an open pipe: "
                           "this process will not die with its parent\n")
