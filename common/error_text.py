"""An error as one line of text: what an operator reads in a refusal, a log line or a page.

libpq, redis-py and others spread a message over several lines (hints, details); the
sentences of ours an error ends go on after it, so its closing full stop goes."""
from __future__ import annotations


def one_line(error: object, *, limit: int | None = None) -> str:
    """``error``'s text on one line without a closing full stop; an exception without text
    gives its type's name; at most ``limit`` characters when given."""
    text = " ".join(str(error).split()).rstrip(".")
    if not text and isinstance(error, BaseException):
        text = type(error).__name__
    return text if limit is None else text[:limit]
