"""The cart, kept in the session: {product_id: quantity}.

Quantities are checked against stock, the active flag and the drop window when a product is
added and whenever the cart is shown (cart and checkout pages); checkout itself re-checks under
the locks. The session stays small: at most SHOP["MAX_CART_LINES"] lines (`CartFull` past it),
and the views add only products the shopper can see (a hidden one is as unknown as a missing one).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.contrib.sessions.backends.base import SessionBase

from shop import errors, money
from shop.conf import shop_settings
from shop.models import ENDED, UPCOMING, Product

KEY = "cart"


@dataclass
class Line:
    """One cart line as shown: `problem` in plain words, `fix_quantity` what is left (0: remove)."""

    product_id: int
    quantity: int
    product: Product | None = None
    problem: str = ""
    fix_quantity: int | None = None
    cap_left: int | None = None

    @property
    def name(self) -> str:
        return self.product.name if self.product is not None else "A product that no longer exists"

    @property
    def buyable(self) -> bool:
        """Whether some of this line can be bought (as it is, or reduced): else it can only go."""
        return not self.problem or bool(self.fix_quantity)

    @property
    def max_quantity(self) -> int | None:
        """The most this line may hold: the stock, or less under the buyer's cap."""
        if self.product is None:
            return None
        return self.product.stock if self.cap_left is None else min(self.product.stock, self.cap_left)

    @property
    def total(self) -> Decimal:
        return self.product.price * self.quantity if self.product is not None else Decimal("0")


def lines(session: SessionBase) -> list[tuple[int, int]]:
    return sorted((int(pid), int(qty)) for pid, qty in session.get(KEY, {}).items())


def set_quantity(session: SessionBase, product_id: int, quantity: int) -> None:
    """Set one line (0 removes it); a new line past SHOP["MAX_CART_LINES"] raises CartFull."""
    cart = dict(session.get(KEY, {}))
    if quantity > 0:
        cap = int(shop_settings.MAX_CART_LINES)
        if str(product_id) not in cart and len(cart) >= cap:
            raise errors.CartFull(f"Your cart is full: at most {cap} products. Remove one to add another.",
                                  details={"max_lines": cap})
        cart[str(product_id)] = quantity
    else:
        cart.pop(str(product_id), None)
    session[KEY] = cart


def quantity_of(session: SessionBase, product_id: int) -> int:
    return int(dict(session.get(KEY, {})).get(str(product_id), 0))


def cap_left(product: Product, held: int) -> int | None:
    """How many more units of `product` a buyer who holds `held` in orders may buy (None: no cap)."""
    cap = product.max_per_user
    return None if cap is None else max(cap - held, 0)


def cap_problem(product: Product, *, held: int, in_cart: int = 0) -> str:
    """The per-buyer cap in the checkout's words, with what the buyer already has."""
    return errors.PurchaseLimitExceeded.wording(limit=product.max_per_user, bought=held, in_cart=in_cart)


def unsold_problem(product: Product) -> str:
    """Why `product` cannot be bought now, in plain words ("" when it can): hidden, its drop not
    open yet, or its sale over."""
    if not product.active:
        return errors.InactiveProduct.default_message
    state = product.drop_state
    if state == UPCOMING:
        return errors.NotOpenYet.wording(product.opens_at)
    if state == ENDED:
        return errors.SaleEnded.wording(called_off=product.called_off)
    return ""


def add_problem(session: SessionBase, product: Product, quantity: int, *, held: int = 0) -> str:
    """Why `quantity` more of `product` cannot go in the cart ("" when it can). `held`: units the
    buyer already holds in orders, which count against a per-buyer cap."""
    if problem := unsold_problem(product):
        return problem
    have = quantity_of(session, product.pk)
    if product.stock == 0:
        return errors.OutOfStock.default_message
    left = cap_left(product, held)
    if left is not None and have + quantity > left:
        return cap_problem(product, held=held, in_cart=have)
    if have + quantity > product.stock:
        already = f" (you already have {have} in your cart)" if have else ""
        return f"Only {product.stock} left{already}."
    return ""


def add(session: SessionBase, product_id: int, quantity: int, *, maximum: int) -> int:
    current = quantity_of(session, product_id)
    new = min(maximum, current + quantity)
    set_quantity(session, product_id, new)
    return new


def review(session: SessionBase, products: dict[int, Product], *, held: dict[int, int] | None = None) -> list[Line]:
    """The cart's lines, each flagged if its product is gone, inactive, sold out, short, or past
    its per-buyer cap (counting the units the buyer `held` in orders, by product id).

    `products` holds what the shopper may see: a hidden product left out reads as gone."""
    held = held or {}
    rows = []
    for pid, qty in lines(session):
        product = products.get(pid)
        left = None if product is None else cap_left(product, held.get(pid, 0))
        row = Line(product_id=pid, quantity=qty, product=product, cap_left=left)
        if product is None:
            row.problem, row.fix_quantity = errors.UnknownProduct.default_message, 0
        elif problem := unsold_problem(product):
            row.problem, row.fix_quantity = f"{product.name}: {problem}", 0
        elif product.stock == 0:
            row.problem, row.fix_quantity = _short(product), 0
        elif left is not None and left < qty and left <= product.stock:
            row.problem = f"{product.name}: {cap_problem(product, held=held.get(pid, 0))}"
            row.fix_quantity = left
        elif product.stock < qty:
            row.problem, row.fix_quantity = _short(product), product.stock
        rows.append(row)
    return rows


def _short(product: Product) -> str:
    """A line short of stock, worded as the checkout's refusal words it."""
    return errors.OutOfStock.wording([{"product_id": product.pk, "available": product.stock}],
                                     {product.pk: product.name})


def reducible(rows: list[Line]) -> bool:
    """Whether reducing a flagged line would help (else the advice is to remove them)."""
    return any(r.problem and r.fix_quantity for r in rows)


def subtotal(rows: list[Line]) -> Decimal:
    return sum((r.total for r in rows), Decimal("0"))


def with_coupon(amount: Decimal, coupon_discount: Decimal | None) -> tuple[Decimal, Decimal]:
    """(discount, total) as checkout computes them: the discount never exceeds the subtotal."""
    off = money.discount(amount, coupon_discount)
    return off, amount - off


def clear(session: SessionBase) -> None:
    session.pop(KEY, None)


def count(session: SessionBase) -> int:
    return sum(int(q) for q in session.get(KEY, {}).values())
