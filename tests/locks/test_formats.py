"""How the lock pages write durations and moments (locks/formats.py): units and a sensible
precision, never a raw float; one date style, in the site's time zone; the templates' filters are
the same functions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.template import Context, Template
from django.utils import timezone

from locks import formats


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"),
    (0, "0 ms"),
    (0.0006738749998476123, "0.67 ms"),  # a job run's duration, once shown as it was stored
    (0.0023456, "2.35 ms"),
    (0.027, "27 ms"),
    (0.2734, "273 ms"),
    (0.9996, "1 s"),  # not "1000 ms"
    (1.234, "1.23 s"),
    (14.756, "14.8 s"),  # a force release's held_for, once shown without its unit
    (105.2, "105 s"),
    (754, "12.6 min"),
    (7300, "2.03 h"),
    (-0.5, "0 ms"),  # clocks of two hosts: never a negative duration
])
def test_a_duration_has_its_unit_and_at_most_three_significant_digits(seconds, text):
    assert formats.duration(seconds) == text


def test_a_moment_is_written_one_way_in_the_site_time_zone():
    moment = datetime(2026, 11, 26, 21, 38, 46, 123456, tzinfo=UTC)
    assert formats.when(moment) == "2026-11-26 21:38:46 UTC"
    assert formats.when(moment.timestamp()) == "2026-11-26 21:38:46 UTC"  # unix seconds (the event log)
    assert formats.when(None) == "-"
    with timezone.override("Europe/Paris"):
        assert formats.when(moment) == "2026-11-26 22:38:46 CET"


def test_the_template_filters_are_the_same_functions():
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    page = Template("{% load locks_format %}{{ s|duration }} | {{ at|when }}").render(
        Context({"s": 14.756, "at": moment}))
    assert page == f"{formats.duration(14.756)} | {formats.when(moment)}" == "14.8 s | 2026-01-02 03:04:05 UTC"
