"""URL converters that cannot turn an odd value into a 500."""

from __future__ import annotations


class CouponCodeConverter:
    """Any coupon code, even one saved before codes were validated (with `/`, `#`, spaces...).

    `reverse()` never fails on a stored code (the regex takes any non-empty text, slashes too;
    Django percent-encodes the rest), and a value that is not a code at all is a 404.
    """

    regex = r".+"
    max_length = 40

    def to_python(self, value: str) -> str:
        if len(value) > self.max_length:
            raise ValueError("too long for a coupon code")  # no match: 404
        return value

    def to_url(self, value: str) -> str:
        return value
