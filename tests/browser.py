"""Launch Debian's Chromium through Playwright (never a downloaded browser)."""

from __future__ import annotations

import shutil
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
