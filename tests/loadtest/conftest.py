"""The shop's fixtures, for the load tests' own tests (they drive the shop)."""

from tests.shop.conftest import make_product, user  # noqa: F401 - fixtures
