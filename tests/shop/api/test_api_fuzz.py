"""Generated bodies against POST /api/orders/: never a 5xx, and a refusal never writes."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shop.models import ApiToken, CouponClaim, Order, OrderLine, Product, StockLedger

pytestmark = pytest.mark.django_db(transaction=True)

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=60),
)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


def line_strategy(product_ids: list[int]):
    return st.fixed_dictionaries(
        {"product_id": st.one_of(st.sampled_from(product_ids), scalars),
         "quantity": st.one_of(st.integers(min_value=-3, max_value=200), scalars)},
        optional={"extra": scalars},
    )


def body_strategy(product_ids: list[int]):
    order_like = st.fixed_dictionaries(
        {"lines": st.one_of(st.lists(line_strategy(product_ids), max_size=25), json_values)},
        optional={"coupon_code": st.one_of(st.text(max_size=50), scalars), "junk": json_values},
    )
    return st.one_of(order_like, json_values)


def snapshot() -> tuple:
    return (tuple(Product.objects.order_by("pk").values_list("stock", flat=True)), Order.objects.count(),
            OrderLine.objects.count(), StockLedger.objects.count(), CouponClaim.objects.count())


def test_generated_bodies_never_5xx_and_refusals_write_nothing(client, user, make_product):
    products = [make_product(stock=1000) for _ in range(3)]
    ids = [p.pk for p in products]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(user_id=user.pk)}"}
    seen_statuses: set[int] = set()

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=body_strategy(ids), raw=st.booleans())
    def check(body, raw):
        payload = json.dumps(body) if not raw else json.dumps(body)[:-1]  # sometimes truncated JSON
        before = snapshot()
        response = client.post("/api/orders/", data=payload, content_type="application/json", **auth)
        seen_statuses.add(response.status_code)
        assert response.status_code < 500, response.content
        assert "error" in response.json() or response.status_code in (200, 201)
        if response.status_code >= 400:
            assert snapshot() == before, f"a refused request ({response.status_code}) wrote something"

    check()
    assert {400} <= seen_statuses  # the generator really hit the validation
