"""claim_coupon: at most `total` claims in all, one per user.

Three guards, strongest last: the per-coupon lock (an orderly queue), the guarded decrement
`remaining >= 1 AND fence < :fence`, and the unique (coupon, user) constraint, which has the last
word on "one per user" (the INSERT-IGNORE / duplicate-key idea, through the ORM).
"""

from __future__ import annotations

from django.db import IntegrityError
from django.db.models import F

from shop import errors
from shop.models import Coupon, CouponClaim
from shop.plumbing.lock_names import coupon_lock
from shop.plumbing.locking import StaleFence, check_before_commit, held, refuse_outer_transaction
from shop.plumbing.transactions import connection_errors, durable_transaction, with_retries
from shop.validation import validate_code


def valid_coupon(code: str) -> Coupon:
    """The coupon for `code` if it exists, is active and is within its validity window."""
    coupon = Coupon.objects.filter(code=code).first()
    if (error := Coupon.refusal(coupon, code)) is not None:
        raise error
    return coupon


@connection_errors()
def claim_coupon(*, user, code: str) -> CouponClaim:
    refuse_outer_transaction("claim_coupon")
    code = validate_code(code)
    coupon = valid_coupon(code)
    # Cheap refusals before queueing on the lock (the guarded writes below re-check both).
    if CouponClaim.objects.filter(coupon=coupon, user=user).exists():
        raise errors.CouponAlreadyClaimed(details={"coupon_code": code})
    if coupon.remaining <= 0:
        raise errors.CouponSoldOut(details={"coupon_code": code})

    def attempt() -> CouponClaim:
        name = coupon_lock(coupon.pk)
        with held([name]) as holds:
            hold = holds[name]
            try:
                with durable_transaction():
                    claim = CouponClaim.objects.create(coupon=coupon, user=user)
                    guarded = Coupon.objects.filter(pk=coupon.pk, remaining__gte=1)
                    if hold is not None:
                        updated = guarded.filter(fence__lt=hold.fence).update(
                            remaining=F("remaining") - 1, fence=hold.fence)
                    else:
                        updated = guarded.update(remaining=F("remaining") - 1)
                    if not updated:
                        row = Coupon.objects.filter(pk=coupon.pk).values("remaining", "fence").get()
                        if hold is not None and row["fence"] >= hold.fence:
                            raise StaleFence(hold.name)
                        raise errors.CouponSoldOut(details={"coupon_code": code})
                    check_before_commit(holds)
            except IntegrityError as exc:
                raise errors.CouponAlreadyClaimed(details={"coupon_code": code}) from exc
            return claim

    return with_retries(attempt, what="claim_coupon")


@connection_errors()
def claim_for_checkout(*, user, code: str) -> CouponClaim:
    """The checkout's "Have a code?" box: the buyer's unused claim of `code`, claimed now
    (claim_coupon) when they have none, so a code typed at checkout needs no visit to the coupon
    center. A claim of theirs already used is CouponAlreadyUsed; unknown, expired and sold-out
    codes are claim_coupon's errors. Nothing is written when it raises."""
    code = validate_code(code)
    mine = CouponClaim.objects.filter(user=user, coupon__code=code).select_related("coupon").first()
    if mine is None:
        return claim_coupon(user=user, code=code)
    if mine.used_at is not None:
        raise errors.CouponAlreadyUsed(details={"coupon_code": code})
    if (error := Coupon.refusal(mine.coupon, code)) is not None:  # ended since it was claimed
        raise error
    return mine
