"""The Sales view's reading (`shop.reads.selectors.product_sales`, `sales_totals`), checked against the
orders: net revenue is what buyers paid (a coupon's discount spread over the order's lines, to
the cent), units per minute counts the last 5 minutes, and the totals add up exactly."""

from __future__ import annotations

import random
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from shop import money
from shop.models import Order, OrderLine, Product
from shop.reads.selectors import RATE_WINDOW, product_sales, sales_totals, units_per_minute
from shop.services import cancel_order, claim_coupon, expire_unpaid, pay_order, place_order, refund_order
from tests.helpers import order_of

pytestmark = pytest.mark.django_db(transaction=True)


def _cents(amount: Decimal) -> int:
    return int(amount * 100)


# --- the rule: shares of an order's payment, line by line ----------------------------------------
@pytest.mark.parametrize(("total", "amounts", "shares"), [
    (500, [1000], [500]),  # a $10 item, a $5 coupon: the line paid $5
    (2200, [1500, 900], [1375, 825]),  # $24 of lines, $2 off: 22/24 of each
    (2000, [1000, 1000, 1000], [667, 666, 667]),  # thirds: the running total is rounded, not each line
    (1, [100, 100, 100], [0, 1, 0]),
    (0, [700, 300], [0, 0]),  # a coupon as large as the order
    (900, [0, 900], [0, 900]),  # a free line pays nothing
    (0, [0], [0]),
])
def test_line_shares_spread_the_discount_in_proportion_to_the_cent(total, amounts, shares):
    assert money.line_shares(total_cents=total, amounts_cents=amounts) == shares
    assert sum(shares) == total


def test_line_shares_are_within_a_cent_of_the_exact_share_and_add_up():
    rng = random.Random(30)
    for _ in range(2000):
        amounts = [rng.choice([0, 1, 99, 12_500, rng.randint(1, 10**7)]) for _ in range(rng.randint(1, 6))]
        total = rng.randint(0, sum(amounts))
        shares = money.line_shares(total_cents=total, amounts_cents=amounts)
        assert sum(shares) == total
        if sum(amounts):
            assert all(abs(s - a * total / sum(amounts)) < 1 for s, a in zip(shares, amounts, strict=True))


# --- the SQL gives what the rule gives --------------------------------------------------------------
def test_net_revenue_in_sql_is_the_rule_applied_to_every_sold_order(make_product, user):
    """Orders written directly (many shapes, faster than checkouts): per product, the SQL's revenue
    equals the sum of `line_shares` of its lines, and all products together what the orders paid."""
    rng = random.Random(7)
    products = [make_product(stock=0, price=price) for price in ("0.01", "0.99", "3.33", "10.00", "1250.00",
                                                                 "0.00", "99999.99")]
    expected = {p.pk: 0 for p in products}
    paid_total = 0
    for i in range(120):
        chosen = sorted(rng.sample(products, rng.randint(1, 4)), key=lambda p: p.pk)
        lines = [(p, rng.randint(1, 7)) for p in chosen]
        subtotal = sum(p.price * q for p, q in lines)
        total = max(Decimal("0.00"), subtotal - Decimal(rng.choice([0, 1, 5, 250, 7]) * rng.random()).quantize(
            Decimal("0.01")))
        status = rng.choice([Order.Status.PAID, Order.Status.PAID, Order.Status.PLACED, Order.Status.CANCELLED,
                             Order.Status.PENDING_PAYMENT])
        order = Order.objects.create(user=user, status=status, subtotal=subtotal, discount=subtotal - total,
                                     total=total, pay_by=timezone.now() + timedelta(minutes=10),
                                     idempotency_key=f"k{i}")
        OrderLine.objects.bulk_create([OrderLine(order=order, product=p, quantity=q, unit_price=p.price)
                                       for p, q in lines])
        if status in (Order.Status.PAID, Order.Status.PLACED):
            shares = money.line_shares(total_cents=_cents(total), amounts_cents=[_cents(p.price * q) for p, q in lines])
            for (p, _), share in zip(lines, shares, strict=True):
                expected[p.pk] += share
            paid_total += _cents(total)
    rows = {p.pk: p.revenue for p in product_sales(products=Product.objects.filter(pk__in=expected))}
    assert {pk: _cents(v) for pk, v in rows.items()} == expected
    assert all(v == v.quantize(Decimal("0.01")) for v in rows.values())
    assert _cents(sales_totals(products=product_sales(products=Product.objects.filter(pk__in=expected)))["revenue"]) \
        == paid_total


# --- every figure against the orders, through the services --------------------------------------
def test_every_figure_and_the_totals_against_the_orders(make_product, make_coupon, user, other_user):
    """A $10 item bought with a $5 coupon counts $5; refunded, cancelled, expired and unpaid orders
    count where they belong; units per minute counts the last 5 minutes only."""
    a = make_product(stock=20, price="10.00")
    b = make_product(stock=10, price="3.00")
    c = make_product(stock=5, price="7.00")
    coupon = make_coupon(total=5, discount="5.00")

    claim_coupon(user=user, code=coupon.code)
    pay_order(order=order_of(place_order(user=user, lines=[(a.pk, 1)], coupon_code=coupon.code)), actor="t")  # $5
    claim_coupon(user=other_user, code=coupon.code)
    pay_order(order=order_of(place_order(user=other_user, lines=[(a.pk, 2), (b.pk, 3)], coupon_code=coupon.code)),
              actor="t")  # $29 of lines, paid $24: a 2000 -> round(2000 x 2400 / 2900) = 1655, b 745
    refunded = pay_order(order=order_of(place_order(user=user, lines=[(a.pk, 4)])), actor="t")
    refund_order(order=refunded, actor="t")  # 4 units back in the stock, no revenue
    cancel_order(order=order_of(place_order(user=user, lines=[(b.pk, 2)])), actor="t")
    order_of(place_order(user=other_user, lines=[(b.pk, 1), (c.pk, 2)]))  # awaiting payment
    late = order_of(place_order(user=user, lines=[(c.pk, 1)]))
    Order.objects.filter(pk=late.pk).update(pay_by=timezone.now() - timedelta(seconds=1))
    expire_unpaid()  # the late order gives its unit back
    old = pay_order(order=order_of(place_order(user=user, lines=[(c.pk, 1)])), actor="t")  # $7, sold
    Order.objects.filter(pk=old.pk).update(created_at=timezone.now() - RATE_WINDOW - timedelta(seconds=5))

    rows = {p.pk: p for p in product_sales(products=Product.objects.filter(pk__in=[a.pk, b.pk, c.pk]))}
    figures = {pk: (r.stock, r.units_sold, r.revenue, r.units_recent, r.units_reserved, r.units_refunded)
               for pk, r in rows.items()}
    assert figures == {
        a.pk: (17, 3, Decimal("21.55"), 3, 0, 4),  # $5 + $16.55; the refunded 4 are back
        b.pk: (6, 3, Decimal("7.45"), 4, 1, 0),  # the cancelled 2 are back; 1 awaiting payment
        c.pk: (2, 1, Decimal("7.00"), 2, 2, 0),  # the expired 1 is back; the sold one is 5 min old
    }
    totals = sales_totals(products=product_sales(products=Product.objects.filter(pk__in=[a.pk, b.pk, c.pk])))
    assert totals == {"products": 3, "stock": 25, "units_sold": 7, "revenue": Decimal("36.00"), "units_recent": 9,
                      "units_reserved": 3, "units_refunded": 4, "gross": Decimal("46.00"),
                      "coupons": Decimal("10.00"), "refunded": Decimal("40.00"), "rate": Decimal("1.8"),
                      "units_paid_late": 0}
    paid = sum(o.total for o in Order.objects.filter(status=Order.Status.PAID))
    assert totals["revenue"] == paid == Decimal("36.00")  # what buyers paid, to the cent
    assert totals["gross"] == sum(o.subtotal for o in Order.objects.filter(status=Order.Status.PAID))
    assert totals["refunded"] == refunded.total
    assert units_per_minute(totals["rate"]) == Decimal("1.8")  # 9 units in 5 minutes
    assert units_per_minute(0) == Decimal("0.0")


# --- issue 37: the money of a sale, and the rate of a drop ---------------------------------------
def test_gross_coupons_and_refunded_money_against_the_orders(make_product, make_coupon, user, other_user):
    """Gross (list amounts of what sold) = net revenue + what coupons took off, per product and in
    total; refunded money is what was paid back for a product's units, spread as revenue is."""
    a = make_product(stock=20, price="10.00")
    b = make_product(stock=10, price="3.00")
    coupon = make_coupon(total=5, discount="5.00")
    claim_coupon(user=user, code=coupon.code)
    pay_order(order=order_of(place_order(user=user, lines=[(a.pk, 2), (b.pk, 3)], coupon_code=coupon.code)),
              actor="t")  # $29 of lines, paid $24: a $16.55, b $7.45
    claim_coupon(user=other_user, code=coupon.code)
    back = pay_order(order=order_of(place_order(user=other_user, lines=[(a.pk, 1), (b.pk, 1)],
                                                coupon_code=coupon.code)), actor="t")  # $13, paid $8
    refund_order(order=back, actor="t")  # a round(1000 x 800 / 1300) = 615, b 185
    rows = {p.pk: p for p in product_sales(products=Product.objects.filter(pk__in=[a.pk, b.pk]))}
    assert [(r.gross, r.coupons, r.revenue, r.units_refunded, r.refunded) for r in (rows[a.pk], rows[b.pk])] == [
        (Decimal("20.00"), Decimal("3.45"), Decimal("16.55"), 1, Decimal("6.15")),
        (Decimal("9.00"), Decimal("1.55"), Decimal("7.45"), 1, Decimal("1.85"))]
    totals = sales_totals(products=product_sales(products=Product.objects.filter(pk__in=[a.pk, b.pk])))
    paid = Order.objects.filter(status=Order.Status.PAID)
    assert totals["gross"] == sum(o.subtotal for o in paid) == Decimal("29.00")
    assert totals["coupons"] == sum(o.discount for o in paid) == Decimal("5.00")
    assert totals["refunded"] == back.total == Decimal("8.00")


def test_a_drops_rate_is_over_its_own_active_time(make_product, user, other_user):
    """10 units sold in a drop's first seconds once read "2.0 a minute" (10 over 5 minutes): the
    rate is over the part of the last 5 minutes the sale was open, so it reads hundreds."""
    from shop.services import end_drop, schedule_drop

    drop, plain = make_product(stock=50), make_product(stock=50)
    schedule_drop(products=[drop], opens_at=timezone.now() - timedelta(seconds=1), closes_at=None, actor="t")
    for buyer in (user, other_user):
        place_order(user=buyer, lines=[(drop.pk, 5)])
    place_order(user=user, lines=[(plain.pk, 5)])
    (drop,) = end_drop(products=[drop], actor="t")
    active = (drop.closes_at - drop.opens_at).total_seconds()
    assert active < 30, active  # generous: the machine is shared
    later = timezone.now() + timedelta(minutes=20)  # read long after the end: still the drop's rate
    rows = {p.pk: p for p in product_sales(products=Product.objects.filter(pk__in=[drop.pk, plain.pk]), now=later)}
    assert rows[drop.pk].units_recent == 10
    assert units_per_minute(rows[drop.pk].rate) >= Decimal(10 * 60 / 30), rows[drop.pk].rate
    expected = Decimal(10 * 60) / Decimal(max(active, 1.0))
    assert abs(rows[drop.pk].rate - expected) <= Decimal("0.01") * expected, (rows[drop.pk].rate, expected)
    # No window: the last 5 minutes, as before (read now: 5 units, 1.0 a minute; 20 minutes later: 0).
    assert units_per_minute(rows[plain.pk].rate) == Decimal("0.0")
    now = {p.pk: p for p in product_sales(products=Product.objects.filter(pk__in=[plain.pk]))}
    assert units_per_minute(now[plain.pk].rate) == Decimal("1.0")
    totals = sales_totals(products=product_sales(products=Product.objects.filter(pk__in=[drop.pk, plain.pk]),
                                                 now=later))
    assert totals["rate"] == rows[drop.pk].rate  # the sum of the products' rates
