"""claim_for_checkout, the checkout's "Have a code?" box: claims and returns the buyer's usable
claim in one step, or a typed error with nothing written. Real MariaDB and Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from shop import errors
from shop.models import Coupon, CouponClaim
from shop.services import claim_coupon, claim_for_checkout, place_order

pytestmark = pytest.mark.django_db(transaction=True)


def _state() -> tuple[list, list]:
    return (list(CouponClaim.objects.order_by("pk").values_list("pk", "used_at")),
            list(Coupon.objects.order_by("pk").values_list("pk", "remaining")))


def test_it_claims_a_new_code_and_returns_an_unused_claim_again(user, make_coupon):
    coupon = make_coupon(total=2)
    claim = claim_for_checkout(user=user, code=coupon.code)
    assert claim.user_id == user.pk and claim.coupon_id == coupon.pk
    assert claim_for_checkout(user=user, code=coupon.code).pk == claim.pk  # no second claim
    coupon.refresh_from_db()
    assert coupon.remaining == 1 and CouponClaim.objects.count() == 1


@pytest.mark.parametrize("case, error", [
    ("unknown", errors.CouponUnknown), ("invalid", errors.InvalidInput), ("expired", errors.CouponExpired),
    ("expired_since_claimed", errors.CouponExpired), ("none_left", errors.CouponSoldOut),
    ("used", errors.CouponAlreadyUsed),
])
def test_refusals_are_typed_and_write_nothing(user, other_user, make_coupon, make_product, case, error):
    coupon = make_coupon(total=1)
    code = {"unknown": "NOPE", "invalid": "x" * 41}.get(case, coupon.code)
    if case in ("expired", "expired_since_claimed"):
        if case == "expired_since_claimed":
            claim_coupon(user=user, code=code)
        Coupon.objects.filter(pk=coupon.pk).update(valid_until=timezone.now() - timedelta(seconds=1))
    elif case == "none_left":
        claim_coupon(user=other_user, code=code)
    elif case == "used":
        claim_coupon(user=user, code=code)
        place_order(user=user, lines=[(make_product(stock=1).pk, 1)], coupon_code=code)
    before = _state()
    with pytest.raises(error) as refused:
        claim_for_checkout(user=user, code=code)
    assert _state() == before
    if case == "used":
        assert refused.value.code == "coupon_already_used" and refused.value.status == 409
        assert refused.value.details == {"coupon_code": code}
