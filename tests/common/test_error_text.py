"""An error's text on one line, as refusals, log lines and pages show it."""
from __future__ import annotations

from common.error_text import one_line


def test_lines_joined_and_the_closing_full_stop_dropped():
    error = OSError('connection to server failed.\nHINT:  is the server running?\n\tDETAIL: port 5432.')
    assert one_line(error) == "connection to server failed. HINT: is the server running? DETAIL: port 5432"


def test_an_exception_without_text_is_named_by_its_type():
    assert one_line(TimeoutError()) == "TimeoutError"
    assert one_line("") == ""  # a text is not an exception: nothing to name


def test_cut_at_the_limit():
    assert one_line(ValueError("x" * 500), limit=300) == "x" * 300
    assert one_line(ValueError("short"), limit=300) == "short"
