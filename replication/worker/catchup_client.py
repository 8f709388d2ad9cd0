"""The worker's catch-up client: GET one page of a writer's facts from the catch-up endpoint
(docs/replication.md, "Catch-up").

Blocking stdlib ``urllib``: the worker runs it in a thread. Every request carries a fresh
transaction ID (:func:`new_txn_id`), as the endpoint keeps each answer under its ID.
"""
from __future__ import annotations

import json
import logging
import secrets
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from replication.http.replication_secret import bearer_header

logger = logging.getLogger(__name__)

#: One catch-up page must come back within this many seconds, or the request is retried.
HTTP_TIMEOUT = 10.0


@dataclass(frozen=True)
class CatchUpPage:
    """One answer of ``get_repl_stream_updates``: ``[token, row]`` pairs, sorted."""

    updates: list[list[Any]]
    upto_token: int
    limited: bool


class CatchUpError(Exception):
    """A catch-up page could not be fetched or read; the follower retries it."""


def new_txn_id() -> str:
    """A transaction ID for one catch-up request: random, never reused. The server keeps its
    answer under the ID for 30 minutes (Synapse does, and so does our endpoint): a reused ID
    would get that old answer back, and stale tokens would pass for "caught up"."""
    return secrets.token_urlsafe(12)


def fetch_catch_up_page(base_url: str, stream: str, writer: str, from_token: int,
                        upto_token: int, *, timeout: float = HTTP_TIMEOUT, secret: str = "",
                        max_range: int | None = None, page_limit: int | None = None,
                        ssl_context: Any = None,
                        txn_id: Callable[[], str] = new_txn_id) -> CatchUpPage:
    """GET one page of ``(from_token, upto_token]`` of ``writer`` on ``stream`` (blocking),
    from ``<base_url>/_synapse/replication/get_repl_stream_updates/<stream>/<txn_id>``, with a
    fresh ``txn_id()`` for every request (retries included).

    ``secret``: sent as ``Authorization: Bearer`` (``REPLICATION_SECRET``). ``max_range``: the
    server's ``REPLICATION_CATCHUP_MAX_RANGE``; a longer range is asked for in pieces (the
    page says ``limited`` until the last piece, so the follower keeps asking).
    ``page_limit``: rows per page to ask for (the server's ``REPLICATION_CATCHUP_MAX_LIMIT``;
    ``None``: the server's default, Synapse's 100). A worker far behind catches up in 10x
    fewer requests with 1,000; a server that refuses the limit is asked again without it.
    """
    asked_upto = upto_token
    if max_range is not None and upto_token - from_token > max_range:
        upto_token = from_token + max_range
    params: dict[str, Any] = {"instance_name": writer, "from_token": from_token, "upto_token": upto_token}
    if page_limit is not None:
        params["limit"] = page_limit
    query = urllib.parse.urlencode(params)
    url = (f"{base_url.rstrip('/')}/_synapse/replication/get_repl_stream_updates/"
           f"{urllib.parse.quote(stream, safe='')}/{txn_id()}?{query}")
    request = urllib.request.Request(url, headers=bearer_header(secret))
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=ssl_context) as response:
            body = json.loads(response.read())
        page = CatchUpPage(list(body["updates"]), int(body["upto_token"]), bool(body["limited"]))
    except urllib.error.HTTPError as e:
        body = e.read()[:200]
        if e.code == 400 and page_limit is not None and b"limit" in body:
            # The server caps pages lower than we asked (REPLICATION_CATCHUP_MAX_LIMIT differs).
            logger.warning("catch-up: %s refused limit=%d (%r); asking without it", base_url, page_limit, body)
            return fetch_catch_up_page(base_url, stream, writer, from_token, asked_upto, timeout=timeout,
                                       secret=secret, max_range=max_range, ssl_context=ssl_context,
                                       txn_id=txn_id)
        raise CatchUpError(f"GET {url}: HTTP {e.code} {body!r}") from e
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CatchUpError(f"GET {url}: {e!r}") from e
    if upto_token < asked_upto and not page.limited:
        return CatchUpPage(page.updates, upto_token, True)
    return page


def parse_instance_map(text: str) -> dict[str, str]:
    """``"w1=http://10.0.0.1:8000,w2=http://10.0.0.2:8000"`` -> writer name -> catch-up base
    URL (``REPLICATION_INSTANCE_MAP``, ``replication_worker --instance-url``). Raises
    ``ValueError`` naming the part it cannot read."""
    result: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, url = (x.strip() for x in part.partition("="))
        scheme = urllib.parse.urlsplit(url).scheme if sep else ""
        if not name or scheme not in ("http", "https") or not urllib.parse.urlsplit(url).netloc:
            raise ValueError(f"cannot read {part!r}: expected writer=http://host:port")
        if name in result:
            raise ValueError(f"writer {name!r} is given twice")
        result[name] = url
    return result
