"""What the endpoint accepts from a peer beyond the wire grammar (docs/security.md), sans-I/O.

:mod:`.commands` parses lines exactly as Synapse does, and Synapse checks nothing more: a
``USER_IP`` may carry a 16 KB "user ID", a ``NAME`` a NUL byte (which PostgreSQL cannot store
in the endpoint's published status). :func:`check_inbound` is applied by the endpoint to every
command it receives, after parsing: a value no real homeserver sends raises
:class:`RemoteProtocolError` (the endpoint answers ``ERROR <text>`` and closes); a user agent
longer than :data:`MAX_USER_AGENT_LENGTH` is cut, since a real client may send one.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Final

from replication.protocol.commands import (
    ClearUserSyncCommand,
    Command,
    ErrorCommand,
    FederationAckCommand,
    LockReleasedCommand,
    NameCommand,
    RemoteProtocolError,
    RemoteServerUpCommand,
    UserIpCommand,
    UserSyncCommand,
)

#: The Matrix spec's limit on a user ID ("MUST NOT exceed 255 bytes"), which we also apply to
#: every other identifier a peer gives us (NAME, instance and device IDs, server names).
MAX_ID_LENGTH: Final = 255
#: Access tokens: Synapse's own are ~60 characters, the macaroons of old versions ~400.
MAX_ACCESS_TOKEN_LENGTH: Final = 1024
#: The longest textual IPv6 address with a zone fits in 64 characters.
MAX_IP_LENGTH: Final = 64
#: User agents are clients' free text: kept to this many characters (a browser's is ~150).
MAX_USER_AGENT_LENGTH: Final = 512
#: Stream tokens are PostgreSQL bigints.
MAX_TOKEN: Final = 2**63 - 1

# The spec's grammar, with the historical localpart characters that servers must still accept
# (every printable ASCII character but ':'): @localpart:server_name, the server name being a
# DNS name, an IPv4 address or a bracketed IPv6 address, with an optional port.
_USER_ID: Final = re.compile(
    r"@[\x21-\x39\x3B-\x7E]+:(?:\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9.\-]+)(?::[0-9]{1,5})?"
)


def user_id_problem(user_id: str) -> str | None:
    """Why ``user_id`` is not a Matrix user ID, or None."""
    if len(user_id.encode("utf-8")) > MAX_ID_LENGTH:
        return f"user ID longer than {MAX_ID_LENGTH} bytes"
    if not _USER_ID.fullmatch(user_id):
        return "not a Matrix user ID (@localpart:server.name)"
    return None


def text_problem(value: str, max_length: int = MAX_ID_LENGTH, *, allow_empty: bool = False) -> str | None:
    """Why ``value`` cannot be kept as a label: empty, too long, or not printable (control
    characters, NUL, line separators)."""
    if not value and not allow_empty:
        return "empty"
    if len(value) > max_length:
        return f"longer than {max_length} characters"
    if not value.isprintable():
        return "contains control or non-printable characters"
    return None


def _refuse(cmd: Command, what: str, problem: str, value: str) -> RemoteProtocolError:
    shown = value if len(value) <= 40 else value[:40] + "..."
    return RemoteProtocolError(f"invalid {cmd.NAME}: {what} {shown!r}: {problem}")


def _check_text(cmd: Command, what: str, value: str, max_length: int = MAX_ID_LENGTH, *,
                allow_empty: bool = False) -> None:
    if (problem := text_problem(value, max_length, allow_empty=allow_empty)) is not None:
        raise _refuse(cmd, what, problem, value)


def _check_user(cmd: Command, user_id: str) -> None:
    if (problem := user_id_problem(user_id)) is not None:
        raise _refuse(cmd, "user ID", problem, user_id)


def check_inbound(cmd: Command) -> Command:
    """``cmd`` as the endpoint keeps it (a long user agent cut), or RemoteProtocolError with
    the ``ERROR`` text naming the field and the problem."""
    if isinstance(cmd, NameCommand):
        _check_text(cmd, "name", cmd.data)
    elif isinstance(cmd, UserSyncCommand):
        _check_text(cmd, "instance ID", cmd.instance_id)
        _check_user(cmd, cmd.user_id)
        if cmd.device_id is not None:
            _check_text(cmd, "device ID", cmd.device_id)
    elif isinstance(cmd, ClearUserSyncCommand):
        _check_text(cmd, "instance ID", cmd.instance_id)
    elif isinstance(cmd, UserIpCommand):
        _check_user(cmd, cmd.user_id)
        _check_text(cmd, "access token", cmd.access_token, MAX_ACCESS_TOKEN_LENGTH)
        _check_text(cmd, "IP", cmd.ip, MAX_IP_LENGTH)
        if cmd.device_id is not None:
            _check_text(cmd, "device ID", cmd.device_id)
        if cmd.user_agent and not cmd.user_agent.isprintable():
            raise _refuse(cmd, "user agent", "contains control or non-printable characters", cmd.user_agent)
        if len(cmd.user_agent) > MAX_USER_AGENT_LENGTH:
            cmd = dataclasses.replace(cmd, user_agent=cmd.user_agent[:MAX_USER_AGENT_LENGTH])
    elif isinstance(cmd, FederationAckCommand):
        _check_text(cmd, "instance name", cmd.instance_name)
        if not 0 <= cmd.token <= MAX_TOKEN:
            raise _refuse(cmd, "token", "out of range", str(cmd.token))
    elif isinstance(cmd, RemoteServerUpCommand):
        _check_text(cmd, "server name", cmd.data)
    elif isinstance(cmd, LockReleasedCommand):
        _check_text(cmd, "instance name", cmd.instance_name)
        _check_text(cmd, "lock name", cmd.lock_name)
        _check_text(cmd, "lock key", cmd.lock_key, MAX_ACCESS_TOKEN_LENGTH, allow_empty=True)
    elif isinstance(cmd, ErrorCommand):
        pass  # only logged, and quoted shortened (see the consumer)
    return cmd
