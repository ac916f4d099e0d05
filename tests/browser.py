"""Launch Debian's Chromium through Playwright (never a downloaded browser).

A test module's browser tests share one Chromium (the `browser` fixture, tests/conftest.py):
starting Playwright's driver and the browser took ~2 s per test, a new context ~0.3 s. Each test
works in contexts of its own (`own_contexts`), so no cookies, storage or cache pass between tests.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise AssertionError("Debian's chromium is not installed: ./dev.sh test installs it (apt-get install chromium)")
    return path


def launch(playwright):
    ARTIFACTS.mkdir(exist_ok=True)
    return playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)


def log_in(context, url: str, user) -> None:
    """Give a Playwright browser context `user`'s session (made by Django's test client, no form)."""
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    context.add_cookies([{"name": name, "value": client.cookies[name].value, "url": url}])


@contextmanager
def module_browser() -> Iterator:
    """Playwright's driver and one Chromium, stopped after (the `browser` fixture's, per module).
    While it runs, this thread counts as inside an event loop (Playwright's sync API): Django's
    ORM needs DJANGO_ALLOW_ASYNC_UNSAFE (the browser modules set it) and asyncio.run() refuses to
    start, so it lives for one module, never for the session."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def own_contexts(browser) -> Iterator:
    """The shared `browser` for a block of a test: every context (and page) opened in the block is
    closed at its end, pass or fail, as closing a browser of its own did."""
    before = set(browser.contexts)
    try:
        yield browser
    finally:
        for context in browser.contexts:
            if context not in before:
                context.close()


@contextmanager
def logged_in_page(browser, url: str, user, *, width: int | None = None, height: int = 740) -> Iterator:
    """A page of a new context of `browser` with `user` logged in at `url` (a `width` x `height`
    viewport if given), the context closed after."""
    with own_contexts(browser):
        context = browser.new_context(**({"viewport": {"width": width, "height": height}} if width else {}))
        log_in(context, url, user)
        yield context.new_page()
