"""The worker's own answers (config/gunicorn_worker.py): what a refused request gets back."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time

import pytest
from django.test import override_settings

from config.gunicorn_worker import busy_response, use_site_headers
from shop.edge import order_requests


def _split(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    assert int(headers["content-length"]) == len(body)
    return status, headers, body


def test_an_api_order_gets_the_apis_error_shape_with_retry_after():
    request = b"POST /api/orders/ HTTP/1.1\r\nHost: x\r\nAccept: */*\r\nContent-Length: 2\r\n\r\n{}"
    status, headers, body = _split(busy_response(request, "queue_full"))
    assert status == "HTTP/1.1 503 Service Unavailable" and headers["retry-after"] == "1"
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["code"] == "busy" and error["details"] == {"retry_after": 1, "where": "server", "reason": "queue_full"}


def test_the_checkout_gets_a_page_that_sends_the_same_order_again_by_itself():
    form = (b"csrfmiddlewaretoken=tok123&idempotency_key=key-9&coupon_code=SPRING-10"
            b"&evil=%22%3E%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    request = (b"POST /checkout/ HTTP/1.1\r\nHost: x\r\nAccept: text/html\r\nContent-Type: "
               b"application/x-www-form-urlencoded\r\nContent-Length: " + str(len(form)).encode() + b"\r\n\r\n" + form)
    status, headers, body = _split(busy_response(request, "full"))
    page = body.decode()
    assert status.endswith("503 Service Unavailable") and headers["content-type"].startswith("text/html")
    assert '<input type=hidden name="idempotency_key" value="key-9">' in page
    assert 'name="csrfmiddlewaretoken" value="tok123"' in page and 'value="SPRING-10"' in page
    assert "action='/checkout/'" in page and ".submit()" in page  # it tries again by itself
    assert "evil" not in page and "alert(1)" not in page  # only the checkout's own fields go back


def test_a_checkout_without_its_key_or_another_page_gets_the_plain_busy_page():
    for request in (b"POST /checkout/ HTTP/1.1\r\nAccept: text/html\r\nContent-Length: 5\r\n\r\nx=1&y",
                    b"GET / HTTP/1.1\r\nAccept: text/html,application/xhtml+xml\r\n\r\n"):
        _, headers, body = _split(busy_response(request, "queue_delay"))
        assert headers["content-type"].startswith("text/html") and b"go back and press the button again" in body
        assert b"<form" not in body


CHECKOUT = (b"POST /checkout/ HTTP/1.1\r\nHost: x\r\nAccept: text/html\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 45\r\n\r\n"
            b"csrfmiddlewaretoken=t&idempotency_key=k-1&a=b")
BUSY_KINDS = {
    "the checkout's page": (CHECKOUT, "text/html", "<form"),
    "a page": (b"GET /cart/ HTTP/1.1\r\nAccept: text/html\r\n\r\n", "text/html", "go back"),
    "JSON": (b"POST /api/orders/?x=1 HTTP/1.1\r\nAccept: text/html\r\nContent-Length: 2\r\n\r\n{}", "application/json",
             '"busy"'),
}


def _hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


@pytest.mark.parametrize("kind", BUSY_KINDS)
def test_every_busy_answer_carries_the_sites_security_headers(client, kind):
    """What Django's middleware gives every answer of the site (a 404 page here), and a
    Content-Security-Policy that allows the page's own inline style and script and nothing else."""
    use_site_headers()
    site = client.get("/no-such-page/")
    request, content_type, marker = BUSY_KINDS[kind]
    _, headers, body = _split(busy_response(request, "full"))
    page = body.decode()
    assert headers["content-type"].startswith(content_type) and marker in page
    for name in ("x-frame-options", "x-content-type-options", "referrer-policy", "cross-origin-opener-policy"):
        assert headers[name] == site.headers[name], name
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    policy = dict([*d.strip().split(" ", 1), ""][:2] for d in headers["content-security-policy"].split(";"))
    assert policy["default-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    styles, scripts = re.findall(r"<style>(.*?)</style>", page), re.findall(r"<script>(.*?)</script>", page)
    assert policy.get("style-src", "") == " ".join(_hash(s) for s in styles)
    assert policy.get("script-src", "") == " ".join(_hash(s) for s in scripts)
    assert bool(scripts) is (kind == "the checkout's page")  # only it retries by itself
    assert "'unsafe-inline'" not in headers["content-security-policy"]


def test_the_busy_answers_follow_the_sites_settings():
    try:
        with override_settings(X_FRAME_OPTIONS="SAMEORIGIN", SECURE_REFERRER_POLICY=["no-referrer", "strict-origin"],
                               SECURE_CROSS_ORIGIN_OPENER_POLICY=None):
            use_site_headers()
            _, headers, _ = _split(busy_response(CHECKOUT, "full"))
    finally:
        use_site_headers()  # the site's own again
    assert headers["x-frame-options"] == "SAMEORIGIN" and headers["referrer-policy"] == "no-referrer,strict-origin"
    assert "cross-origin-opener-policy" not in headers


def test_only_the_web_checkout_gets_the_page_that_orders_again():
    """The one rule decides which busy answer a request gets: odd spellings of the checkout get its
    page, the API always JSON, and a request line the rule cannot read gets JSON."""
    form = CHECKOUT.split(b" ", 2)[2]
    for target in (b"/checkout/?next=x", b"http://x/checkout/", b"//checkout//"):
        assert b"<form" in busy_response(b"POST " + target + b" " + form, "full"), target
    for line in (b"GET /checkout/ HTTP/1.1", b"POST /api/orders/ HTTP/1.1", b"POST /api//orders/ HTTP/1.1"):
        assert b"<form" not in busy_response(line + CHECKOUT.split(b"HTTP/1.1", 1)[1], "full"), line
    assert busy_response(b"\xff\xfe garbage", "full").split(b"\r\n\r\n", 1)[1].startswith(b'{"error"')


def test_a_busy_answer_is_sent_even_if_reading_the_request_fails(monkeypatch, caplog):
    """The main loop's last guard: the property tests show the reading never raises; should it
    all the same, the client still gets its 503 (JSON) and the log says why."""
    def broken(request):
        raise RuntimeError("unreadable")

    monkeypatch.setattr(order_requests, "request_line", broken)
    with caplog.at_level(logging.ERROR, logger="gunicorn.error"):
        status, headers, body = _split(busy_response(CHECKOUT, "full"))
    assert status.endswith("503 Service Unavailable") and json.loads(body)["error"]["code"] == "busy"
    assert headers["x-content-type-options"] == "nosniff" and "could not be read" in caplog.text


def test_the_date_header_is_formatted_once_a_second_and_reads_as_gunicorns():
    from email.utils import formatdate, parsedate_to_datetime

    from config import gunicorn_worker

    for _ in range(3):
        before = time.time()
        text = gunicorn_worker.http_date()
        after = time.time()
        assert text in (formatdate(int(before), usegmt=True), formatdate(int(after), usegmt=True))
        assert int(before) <= parsedate_to_datetime(text).timestamp() <= after
        time.sleep(0.4)
    assert gunicorn_worker.http_date(0) == formatdate(0, usegmt=True)  # a given time: as gunicorn does it
