"""The project's tests use the shop's fixtures (products, a drop, a live server)."""

from tests.shop.conftest import drop, make_product, server, user  # noqa: F401
