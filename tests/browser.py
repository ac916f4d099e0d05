"""Launch Debian's Chromium through Playwright (never a downloaded browser)."""

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
def logged_in_page(url: str, user, *, width: int | None = None, height: int = 740) -> Iterator:
    """A Chromium page with `user` logged in at `url` (a `width` x `height` viewport if given),
    the browser closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            context = browser.new_context(**({"viewport": {"width": width, "height": height}} if width else {}))
            log_in(context, url, user)
            yield context.new_page()
        finally:
            browser.close()
