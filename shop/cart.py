"""The cart, kept in the session: {product_id: quantity}. Stock is checked at checkout only."""

from __future__ import annotations

from django.contrib.sessions.backends.base import SessionBase

KEY = "cart"


def lines(session: SessionBase) -> list[tuple[int, int]]:
    return sorted((int(pid), int(qty)) for pid, qty in session.get(KEY, {}).items())


def set_quantity(session: SessionBase, product_id: int, quantity: int) -> None:
    cart = dict(session.get(KEY, {}))
    if quantity > 0:
        cart[str(product_id)] = quantity
    else:
        cart.pop(str(product_id), None)
    session[KEY] = cart


def add(session: SessionBase, product_id: int, quantity: int, *, maximum: int) -> int:
    current = dict(session.get(KEY, {})).get(str(product_id), 0)
    new = min(maximum, current + quantity)
    set_quantity(session, product_id, new)
    return new


def clear(session: SessionBase) -> None:
    session.pop(KEY, None)


def count(session: SessionBase) -> int:
    return sum(int(q) for q in session.get(KEY, {}).values())
