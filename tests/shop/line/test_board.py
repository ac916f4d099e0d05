"""The lines as operators watch them (shop/line/board.py): the line gauges and counters of
/metrics, over the real Redis and MariaDB, and docs/metrics.md's list of them."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from shop import errors, line
from shop.services import place_order
from tests import helpers

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "scrape-token-line-0123456789"


@pytest.fixture
def scrape(client, settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = TOKEN, []

    def get() -> dict[tuple[str, tuple], float]:
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}

    return get


def test_metrics_show_each_lines_length_waiting_let_through_answers_and_forged_tickets(settings, scrape, drop):
    settings.SHOP = {**settings.SHOP, "LINE_WINDOW": 1}
    p = drop(stock=5)
    label = (("product", str(p.pk)),)
    first, second, third = helpers.make_users(3, prefix="gauged")
    before = scrape()
    assert place_order(user=first, lines=[(p.pk, 1)]).order_id  # let through, answered: placed
    line.join(config=line.config_of(p), user_id=second.pk, start=True, until=time.monotonic() + 60)  # in checkout
    with pytest.raises(errors.InLine) as waiting:
        place_order(user=third, lines=[(p.pk, 1)])
    forged = waiting.value.details["ticket"][:-4] + "AAAA"
    with pytest.raises(errors.InvalidLineTicket):
        place_order(user=third, lines=[(p.pk, 1)], line_ticket=forged)
    after = scrape()

    assert after[("flashsale_line_length", label)] == 3
    assert after[("flashsale_line_waiting", label)] == 1
    assert after[("flashsale_line_in_checkout", label)] == 1
    assert after.get(("flashsale_line_let_through_total", label), 0) - before.get(
        ("flashsale_line_let_through_total", label), 0) == 2
    placed = (("outcome", "placed"),)
    assert after[("flashsale_line_answer_seconds_count", placed)] - before.get(
        ("flashsale_line_answer_seconds_count", placed), 0) == 1
    assert after[("flashsale_line_tickets_refused_total", ())] - before.get(
        ("flashsale_line_tickets_refused_total", ()), 0) == 1


def test_a_pre_queue_counts_as_waiting_and_a_product_without_a_drop_has_no_gauge(scrape, drop, make_product, user):
    queued = drop(opens_at=timezone.now() + timedelta(seconds=60), line_prequeue_seconds=300)
    plain = make_product()
    with pytest.raises(errors.InLine):
        place_order(user=user, lines=[(queued.pk, 1)])
    found = scrape()
    assert found[("flashsale_line_length", (("product", str(queued.pk)),))] == 1
    assert found[("flashsale_line_waiting", (("product", str(queued.pk)),))] == 1
    assert ("flashsale_line_length", (("product", str(plain.pk)),)) not in found


def test_every_line_metric_is_in_docs_metrics():
    from shop.ops import metrics

    exported = {m.describe()[0].name for m in (metrics.LINE_ANSWERS, metrics.LINE_ANSWER_SECONDS,
                                                metrics.LINE_LET_THROUGH, metrics.LINE_TICKETS_REFUSED)}
    exported |= {family.name for family in line.board.LineCollector().collect()}
    documented = set(re.findall(r"`(flashsale_line_[a-z_]+)[{`]", (ROOT / "docs" / "metrics.md").read_text()))
    assert exported <= {name.removesuffix("_total") for name in documented}, exported - documented
