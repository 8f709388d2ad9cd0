"""``GET /_synapse/replication/get_repl_stream_updates/<stream>/<txn_id>``: catch-up for a
worker that missed updates (Synapse's ``synapse/replication/http/streams.py``). See
docs/replication.md, "Catch-up".

As in Synapse, ``<txn_id>`` is a fresh random ID per request and the answer is kept under it
for 30 minutes (:mod:`.txn_cache`, per process): a repeated ID gets the first answer again,
whatever the stream and tokens asked for, so callers must never reuse one. Only answers are
kept, not refusals (400). The ID is 1 to 64 URL-safe characters (:func:`.txn_cache.txn_id_problem`;
Synapse's workers send 10 letters), else 400. The form without ``<txn_id>`` is not served: 404
``M_UNRECOGNIZED``, Synapse's answer to it.

Query: ``from_token``, ``upto_token`` (integers, required), ``instance_name`` (the writer;
default this process's ``INSTANCE_NAME``), ``limit`` (rows per page, default 100, at most
``REPLICATION_CATCHUP_MAX_LIMIT``). ``upto_token - from_token`` may be at most
``REPLICATION_CATCHUP_MAX_RANGE`` (the worker asks for longer ranges piece by piece); beyond
either cap the answer is 400 with a message. Answer: ``{"updates": [[token, row], ...],
"upto_token": N, "limited": bool}``; a limited answer covers every row up to ``upto_token``
(rows sharing a token are never split) and the caller continues from there. Tokens past 64
bits and ``instance_name`` values with control characters are refused (400) before any query.
``typing`` is answered from this process's memory when it is the typing writer
(replication/typing_stream.py), 400 otherwise.
"""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from replication.http.replication_secret import replication_secret_required
from replication.http.txn_cache import TxnResponseCache, txn_id_problem
from replication.http.typing_changes import typing_writer
from streams.conf import instance_name as this_instance
from streams.conf import repl_setting
from streams.id_generator import NotAWriter
from streams.identifiers import MAX_STREAM_ID, bad_identifier, fits_stream_id, is_whole_number
from streams.registry import STREAMS
from streams.updates_since import TARGET_ROW_COUNT, get_updates_since

#: This process's answers by transaction ID (JSON bytes: never mutated once kept).
RESPONSES = TxnResponseCache()


def _error(message: str) -> JsonResponse:
    return JsonResponse({"errcode": "M_INVALID_PARAM", "error": message}, status=400)


@replication_secret_required
@require_GET
def get_repl_stream_updates(request: HttpRequest, stream_name: str, txn_id: str) -> HttpResponse:
    problem = txn_id_problem(txn_id)
    if problem:
        return _error(problem)
    kept = RESPONSES.get(txn_id)
    if kept is None:
        answer = _updates(request, stream_name)
        if answer.status_code != 200:
            return answer
        kept = RESPONSES.add(txn_id, answer.content)
    return HttpResponse(kept, content_type="application/json")


@replication_secret_required
def without_txn_id(request: HttpRequest, stream_name: str) -> JsonResponse:
    """The form without ``<txn_id>``: Synapse has no such route, nor do we."""
    return JsonResponse({"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request: "
                         "get_repl_stream_updates needs a transaction ID, "
                         f".../get_repl_stream_updates/{stream_name}/<txn_id>"}, status=404)


def _updates(request: HttpRequest, stream_name: str) -> JsonResponse:
    spec = STREAMS.get(stream_name)
    if spec is None:
        return JsonResponse({"errcode": "M_UNKNOWN", "error": "Unknown stream"}, status=400)
    try:
        raw_tokens = request.GET["from_token"], request.GET["upto_token"]
    except KeyError as e:
        return _error(f"missing query parameter {e.args[0]}")
    if not all(is_whole_number(t) for t in raw_tokens):
        return _error("from_token and upto_token must be integers")
    if not all(fits_stream_id(t) for t in raw_tokens):
        return _error(f"from_token and upto_token must be at most {MAX_STREAM_ID}")
    from_token, upto_token = (int(t) for t in raw_tokens)
    if from_token < 0 or upto_token < 0:
        return _error("tokens must not be negative")
    max_range = repl_setting("REPLICATION_CATCHUP_MAX_RANGE")
    if upto_token - from_token > max_range:
        return _error(f"upto_token - from_token is {upto_token - from_token}, more than the "
                      f"allowed {max_range} (REPLICATION_CATCHUP_MAX_RANGE): ask in pieces")
    max_limit = repl_setting("REPLICATION_CATCHUP_MAX_LIMIT")
    # Unasked, Synapse's page size (or the cap, when an operator set it lower).
    raw_limit = request.GET.get("limit", str(min(TARGET_ROW_COUNT, max_limit)))
    if not fits_stream_id(raw_limit):
        return _error("limit must be an integer")
    limit = int(raw_limit)
    if not 0 < limit <= max_limit:
        return _error(f"limit must be between 1 and {max_limit} (REPLICATION_CATCHUP_MAX_LIMIT)")
    writer = request.GET.get("instance_name") or this_instance()
    problem = bad_identifier("instance_name", writer)
    if problem:
        return _error(problem)
    if spec.name == "typing":
        # In memory, in its writer: this process must be it (Synapse asks the typing writer).

        try:
            result = typing_writer().updates_since(from_token, upto_token, limit)
        except NotAWriter as e:
            return JsonResponse({"errcode": "M_UNKNOWN", "error": str(e)}, status=400)
    else:
        result = get_updates_since(spec, writer, from_token, upto_token, limit=limit)
    return JsonResponse({
        "updates": [[token, row] for token, row in result.updates],
        "upto_token": result.upto_token,
        "limited": result.limited,
    })
