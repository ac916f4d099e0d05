"""The worker's own answers (shop/gunicorn_worker.py): what a refused request gets back."""

from __future__ import annotations

import json

from shop.gunicorn_worker import busy_response


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
