"""One error hierarchy: every code is registered by defining its class, and travels intact."""

from __future__ import annotations

import pytest

from shop import errors
from shop.checkout import protocol


def _all(cls: type[errors.ShopError]) -> set[type[errors.ShopError]]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_all(sub)}
    return out


def test_every_error_class_is_registered_by_its_code():
    classes = {c for c in _all(errors.ShopError) if "code" in c.__dict__ and c.__module__ == "shop.errors"}
    assert {c.code: c for c in classes}.items() <= errors.ERRORS_BY_CODE.items()
    assert len(classes) >= 25


def test_a_new_error_is_registered_and_a_taken_code_is_refused():
    class Brand(errors.ShopError):
        code = "test_only_brand_new"

    try:
        assert errors.ERRORS_BY_CODE["test_only_brand_new"] is Brand
        refused = protocol.Refused.of(Brand(details={"x": 1}))
        assert type(refused.error()) is Brand  # a combined buyer's reply names it by code
        with pytest.raises(TypeError, match="taken"):
            type("Twin", (errors.ShopError,), {"code": "out_of_stock"})
    finally:
        errors.ERRORS_BY_CODE.pop("test_only_brand_new", None)


@pytest.mark.parametrize("code", sorted(errors.ERRORS_BY_CODE))
def test_every_code_round_trips_through_a_combiners_reply(code):
    cls = errors.ERRORS_BY_CODE[code]
    sent = protocol.Refused.of(cls(details={"k": "v"}))
    got = protocol.from_json(protocol.to_json(sent))
    assert isinstance(got.error(), cls) and got.error().details == {"k": "v"}
