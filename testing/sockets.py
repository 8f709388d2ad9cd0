"""Which TCP ports a tree of processes listens on, read from ``/proc`` (what ``ss -ltnp``
shows, without needing ``ss`` or the right to see other users' processes).

Used by the tests that check a job's processes open nothing beyond loopback
(tests/jobs/test_spark_exposure.py).
"""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

#: ``st`` of a listening socket in /proc/net/tcp{,6}
TCP_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str  # the process's name (``java``, ``python3``)
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        """Reachable from this host only: 127.0.0.0/8, ::1, or ::ffff:127.x (never a wildcard)."""
        ip = ipaddress.ip_address(self.address)
        mapped = getattr(ip, "ipv4_mapped", None)
        return (mapped or ip).is_loopback

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.command}[{self.pid}] {host}:{self.port}"


def descendants(pid: int) -> dict[int, str]:
    """pid -> command name of every live process below ``pid``."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        parents[int(entry)] = int(rest.split()[1])
        names[int(entry)] = head.split("(", 1)[1]
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = names[child]
                frontier.append(child)
    return found


def _address(hex_address: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    swapped = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(swapped))


def _listening_inodes(pid: int) -> dict[str, tuple[str, int]]:
    """inode -> (address, port) of every listening TCP socket in ``pid``'s network namespace."""
    found = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == TCP_LISTEN:
                address, port = local.rsplit(":", 1)
                found[inode] = (_address(address), int(port, 16))
    return found


def listening_sockets(pids: dict[int, str]) -> list[Listener]:
    """The listening TCP sockets whose descriptors these processes (pid -> name) hold."""
    out = []
    for pid, command in pids.items():
        inodes = _listening_inodes(pid)
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # ended meanwhile
            continue
        held = set()
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes and target not in held:
                held.add(target)
                address, port = inodes[target[8:-1]]
                out.append(Listener(pid, command, address, port))
    return sorted(out, key=lambda s: (s.pid, s.port))
