"""Error reports never show a password that sits inside a URL setting."""

from __future__ import annotations

import sys

from django.test import RequestFactory
from django.views.debug import ExceptionReporter, get_default_exception_reporter_filter

from config.reporting import SafeUrlExceptionReporterFilter, mask_url_credentials

PASSWORD = "-".join(("s3cr3t", "Pa55"))  # never literally in the source the report quotes


def _report(request) -> tuple[str, str]:
    database_url = f"mysql://shop:{PASSWORD}@db.internal:3306/shop"  # a local in the failing frame
    try:
        raise RuntimeError(f"cannot reach {database_url.split('@')[1]}")
    except RuntimeError:
        reporter = ExceptionReporter(request, *sys.exc_info())
        return reporter.get_traceback_html(), reporter.get_traceback_text()


def test_the_debug_page_and_the_text_report_hide_url_passwords(settings):
    settings.DATABASE_URL = f"mysql://shop:{PASSWORD}@db.internal:3306/shop"
    settings.REDIS_URL = f"redis://:{PASSWORD}@redis.internal:6379/0"
    settings.LOCKS_REDIS_URL = f"rediss://locks:{PASSWORD}@redis.internal:6380/0?password={PASSWORD}"
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": settings.REDIS_URL}}
    request = RequestFactory().get("/boom/", HTTP_X_UPSTREAM=f"redis://u:{PASSWORD}@h:1/0")
    html, text = _report(request)
    assert "db.internal" in html and "redis.internal" in html  # the report is still useful...
    assert PASSWORD not in html and PASSWORD not in text  # ...and shows no password
    assert isinstance(get_default_exception_reporter_filter(), SafeUrlExceptionReporterFilter)


def test_mask_url_credentials():
    assert mask_url_credentials("mysql://root@127.0.0.1:3306/shop") == "mysql://root@127.0.0.1:3306/shop"
    masked = mask_url_credentials(f"mysql://shop:{PASSWORD}@db:3306/shop and redis://:{PASSWORD}@r:6379/0")
    assert PASSWORD not in masked and "mysql://shop:" in masked and "@db:3306/shop" in masked
    assert PASSWORD not in mask_url_credentials(f"redis://r:6379/0?db=1&password={PASSWORD}")


def test_a_password_with_an_unescaped_at_sign_is_masked_whole():
    """redis-py and MySQLdb read 'u:a@b@host' as password 'a@b' (the host follows the last '@')."""
    masked = mask_url_credentials(f"mysql://shop:a@{PASSWORD}@db:3306/shop, redis://:{PASSWORD}@x@r:6379")
    assert PASSWORD not in masked and "@db:3306/shop" in masked and "@r:6379" in masked
    assert SafeUrlExceptionReporterFilter.cleansed_substitute in masked  # the one mask, reports and start-up alike


def test_the_request_log_leaves_out_the_503s_the_shop_answers_on_purpose():
    import logging

    from config.reporting import NotRefusals

    def record(status: int) -> logging.LogRecord:
        r = logging.LogRecord("django.request", logging.ERROR, __file__, 1, "x", (), None)
        r.status_code = status
        return r

    keep = NotRefusals()
    assert not keep.filter(record(503))  # busy, lock_timeout...: thousands a second in a crowd
    assert keep.filter(record(500))  # a real server error is still logged
