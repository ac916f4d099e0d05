"""An order's deadline: the server's budget from its arrival, or the client's shorter one."""

from __future__ import annotations

import time

import pytest
from django.test import RequestFactory

from shop.edge import deadlines


@pytest.mark.parametrize(("header", "wanted"), [
    ("wait=2", 2.0),
    ("respond-async, wait=1.5", 1.5),
    ("handling=lenient; wait=3", 3.0),
    ('wait="4"', 4.0),
    ("WAIT = 0.25", 0.25),
    ("wait=abc", None),
    ("wait=", None),
    ("await=2", None),
    ("", None),
    ("wait=1e9", None),
])
def test_prefer_wait_reads_rfc_7240s_wait(header, wanted):
    assert deadlines.prefer_wait(header) == wanted


def test_the_deadline_counts_from_arrival_and_takes_the_shorter_budget(settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "LOCK_WAIT": 3.0}
    arrived = time.monotonic() - 0.5
    plain = RequestFactory().post("/api/orders/", **{"shop.arrived": arrived})
    assert deadlines.of_request(plain) == pytest.approx(arrived + 4.0)
    hurried = RequestFactory().post("/api/orders/", HTTP_PREFER="wait=1", **{"shop.arrived": arrived})
    assert deadlines.of_request(hurried) == pytest.approx(arrived + 1.0)
    patient = RequestFactory().post("/api/orders/", HTTP_PREFER="wait=60", **{"shop.arrived": arrived})
    assert deadlines.of_request(patient) == pytest.approx(arrived + 4.0)  # never more than the server's


def test_the_line_ends_before_the_deadline_to_leave_time_to_answer():
    deadline = time.monotonic() + 4.0
    assert deadlines.line_wait_until(deadline) == pytest.approx(deadline - 1.0, abs=0.01)
    soon = time.monotonic() + 0.4
    assert deadlines.line_wait_until(soon) == pytest.approx(soon - 0.2, abs=0.01)  # half of what is left
    assert deadlines.passed(time.monotonic() + 0.01) and not deadlines.passed(time.monotonic() + 1)
