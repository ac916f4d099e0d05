"""`TimedRead`: the per-second reads compiled once give what evaluating their querysets gives, at
every time (each place of the time in the SQL gets the read's own), on the real MariaDB."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shop.models import Product
from shop.reads import selectors
from shop.reads.compiled import TimedRead

pytestmark = pytest.mark.django_db


def _windows(make_product) -> list[Product]:
    now = timezone.now()
    made = []
    for opens, closes, age in [(None, None, None), (-60, None, None), (60, None, timedelta(days=2)),
                               (-60, 30, None), (-60, -30, timedelta(hours=1)), (None, -5, None),
                               (None, None, timedelta(days=7)), (120, 120, None)]:
        p = make_product()
        p.opens_at = now + timedelta(seconds=opens) if opens is not None else None
        p.closes_at = now + timedelta(seconds=closes) if closes is not None else None
        p.min_account_age = age
        p.save()
        made.append(p)
    return made


@pytest.mark.parametrize("offset", [-3600, -61, -59, 0, 29, 31, 61, 121, 86400])
def test_a_compiled_read_gives_what_its_queryset_gives_at_every_time(make_product, offset):
    _windows(make_product)
    now = timezone.now() + timedelta(seconds=offset)
    rules = Product.objects.filter(Q(min_account_age__isnull=False) | Q(opens_at__isnull=False)).not_over(now=now)
    assert selectors.drop_rules(now=now) == list(rules.values_list("pk", "min_account_age", "opens_at"))
    lines = selectors.lined_products(now=now).values_list(*selectors.LINE_FIELDS)
    assert selectors.line_rows(now=now) == list(lines)


def test_the_rows_change_with_the_time_of_each_read_and_the_sql_is_compiled_once(make_product):
    ended_soon = make_product()
    ended_soon.opens_at = timezone.now() - timedelta(seconds=60)
    ended_soon.closes_at = timezone.now() + timedelta(seconds=30)
    ended_soon.save()
    compiled_reads = []
    read = TimedRead(lambda now: (compiled_reads.append(now),
                                  Product.objects.filter(opens_at__isnull=False).not_over(now=now)
                                  .values_list("pk", "closes_at"))[1])
    before = read.rows(now=timezone.now())
    after = read.rows(now=timezone.now() + timedelta(seconds=31))
    assert [pk for pk, _ in before] == [ended_soon.pk]
    assert before[0][1] == ended_soon.closes_at and timezone.is_aware(before[0][1])  # Django's converters ran
    assert after == []
    assert len(compiled_reads) == 1  # built once, with the stand-in time; every read after sends its SQL
    with CaptureQueriesContext(connection) as queries:
        read.rows(now=timezone.now())
    assert len(queries) == 1


_offsets = st.one_of(st.none(), st.integers(min_value=-3 * 86400, max_value=3 * 86400))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(windows=st.lists(st.tuples(_offsets, _offsets, st.one_of(st.none(), st.integers(0, 10**6)), st.booleans()),
                        min_size=1, max_size=6),
       at=st.integers(min_value=-4 * 86400, max_value=4 * 86400), micro=st.integers(0, 999_999))
def test_any_windows_at_any_time_read_as_their_querysets(make_product, windows, at, micro):
    """Generated windows (opening, closing, minimum age in seconds, active) and times to the
    microsecond: the compiled reads give the querysets' rows, in their order."""
    base = timezone.now().replace(microsecond=0)
    Product.objects.all().delete()
    for opens, closes, age, active in windows:
        if opens is not None and closes is not None and closes < opens:
            opens, closes = closes, opens  # the table refuses a close before the opening
        p = make_product(active=active)
        p.opens_at = base + timedelta(seconds=opens) if opens is not None else None
        p.closes_at = base + timedelta(seconds=closes) if closes is not None else None
        p.min_account_age = timedelta(seconds=age) if age is not None else None
        p.save()
    now = base + timedelta(seconds=at, microseconds=micro)
    rules = Product.objects.filter(Q(min_account_age__isnull=False) | Q(opens_at__isnull=False)).not_over(now=now)
    assert selectors.drop_rules(now=now) == list(rules.values_list("pk", "min_account_age", "opens_at"))
    assert selectors.line_rows(now=now) == list(selectors.lined_products(now=now).values_list(*selectors.LINE_FIELDS))
