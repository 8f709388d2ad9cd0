"""common/url_redaction.py: URL passwords masked in URLs, free text, log lines and the
debug page's settings."""
from __future__ import annotations

import logging

from common.url_redaction import (
    RedactingExceptionReporterFilter,
    RedactingFormatter,
    RedactingWrapper,
    redact_text,
    redact_url,
)


def test_redact_url():
    assert redact_url("postgres://u:pw@h:5432/db") == "postgres://u:***@h:5432/db"
    assert redact_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("rediss://user:p%40ss@h/0?ssl_ca_certs=/ca.pem") == "rediss://user:***@h/0?ssl_ca_certs=/ca.pem"
    assert redact_url("postgres://u@h/db") == "postgres://u@h/db"
    assert redact_url("redis://h:notaport/0") == "redis://h:notaport/0"
    assert redact_url("redis://:pw@h:notaport/0") == "redis://:***@h:notaport/0"


def test_redact_text_masks_every_url_in_a_line():
    text = "could not reach postgres://synapse:hunter2@db/synapse nor redis://:s3cr@t@r:6379/0, giving up"
    assert redact_text(text) == "could not reach postgres://synapse:***@db/synapse nor redis://:***@r:6379/0, giving up"
    assert redact_text("no URL: a:b@c") == "no URL: a:b@c"


def test_log_lines_and_tracebacks_are_redacted():
    formatter = RedactingFormatter("%(message)s")
    try:
        raise ConnectionError("refused by redis://:tb-secret@h:1/0")
    except ConnectionError:
        import sys
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "connecting to %s", ("postgres://u:arg-secret@h/d",),
                                   sys.exc_info())
    line = formatter.format(record)
    assert "arg-secret" not in line and "tb-secret" not in line
    assert "postgres://u:***@h/d" in line and "redis://:***@h:1/0" in line


def test_debug_page_settings_are_redacted(settings):
    settings.DATABASE_URL = "postgres://u:page-secret@h/d"
    settings.CHANNEL_LAYERS = {"default": {"CONFIG": {"hosts": [{"address": "redis://:layer-secret@h/0"}]}}}
    safe = repr(RedactingExceptionReporterFilter().get_safe_settings())
    assert "page-secret" not in safe and "layer-secret" not in safe
    assert "postgres://u:***@h/d" in safe


def test_celery_log_handlers_are_wrapped():
    from jobs.celery_app import redact_celery_logs

    logger = logging.getLogger("celery-test")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    logger.addHandler(handler)
    try:
        redact_celery_logs(logger=logger)
        redact_celery_logs(logger=logger)  # idempotent
        assert isinstance(handler.formatter, RedactingWrapper)
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "broker %s", ("redis://:cel-secret@h/0",), None)
        assert handler.format(record) == "[INFO] broker redis://:***@h/0"
    finally:
        logger.removeHandler(handler)
