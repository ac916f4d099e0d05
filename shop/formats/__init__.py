"""The shop's date formats (settings.FORMAT_MODULE_PATH): one style everywhere in the admin,
"28 Nov 2026 20:15", 24-hour, as the lists' short "28 Nov 20:15"; the input formats stay Django's."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone


def shop_time(when: datetime) -> str:
    """A time as the shop states it without JavaScript: "2026-12-01 10:00 UTC", in the shop's
    time zone (settings.TIME_ZONE)."""
    return timezone.localtime(when).strftime("%Y-%m-%d %H:%M %Z")
