"""The checkout's busy page in a real Chromium: under its Content-Security-Policy (inline script
allowed by its hash only) it still sends the same order again by itself."""

from __future__ import annotations

import pytest

from config.gunicorn_worker import busy_response, use_site_headers
from tests.browser import launch

pytestmark = pytest.mark.browser

START = ("<!doctype html><form method=post action='/checkout/'>"
         "<input name=csrfmiddlewaretoken value=tok-1><input name=idempotency_key value=key-7>"
         "<input name=coupon_code value=''><button id=order>Order</button></form>")


def _as_raw_request(request) -> bytes:
    """The browser's request as the worker would have read it off the socket."""
    body = (request.post_data or "").encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items() if k.lower() != "content-length")
    return (f"{request.method} /checkout/ HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\n\r\n").encode() + body


def test_the_checkouts_busy_page_orders_again_by_itself_under_its_policy():
    from playwright.sync_api import sync_playwright

    use_site_headers()
    posts: list[str] = []
    refused: list[str] = []

    def serve(route, request):
        if request.url.endswith("/start"):
            return route.fulfill(status=200, content_type="text/html", body=START)
        posts.append(request.post_data or "")
        if len(posts) > 1:
            return route.fulfill(status=200, content_type="text/html", body="<p id=placed>Placed</p>")
        head, _, page = busy_response(_as_raw_request(request), "full").partition(b"\r\n\r\n")
        headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
        return route.fulfill(status=503, headers=headers, body=page)

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page()
            page.on("console", lambda message: refused.append(message.text)
                    if "Content Security Policy" in message.text else None)
            page.route("http://shop.test/**", serve)
            page.goto("http://shop.test/start")
            page.click("#order")
            page.wait_for_selector("#placed", timeout=15_000)  # the busy page posted the order again
        finally:
            browser.close()
    assert len(posts) == 2 and posts[0] == posts[1]  # the same order, with the same key
    assert "idempotency_key=key-7" in posts[1] and "csrfmiddlewaretoken=tok-1" in posts[1]
    assert refused == []
