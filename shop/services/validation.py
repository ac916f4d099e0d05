"""Input checks shared by every service: plain Python, before any lock or query."""

from __future__ import annotations

from shop import errors
from shop.conf import shop_settings

MAX_CODE_LENGTH = 40
MAX_KEY_LENGTH = 128


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_lines(lines: object) -> list[tuple[int, int]]:
    """(product_id, quantity) pairs, sorted by product id. A product may appear once."""
    if not isinstance(lines, list | tuple) or not lines:
        raise errors.InvalidInput("An order needs at least one line.", details={"lines": "required"})
    cap = int(shop_settings.MAX_LINES_PER_ORDER)
    if len(lines) > cap:
        raise errors.InvalidInput(f"At most {cap} lines per order.", details={"lines": f"at most {cap}"})
    max_qty = int(shop_settings.MAX_QUANTITY_PER_LINE)
    out: dict[int, int] = {}
    for i, line in enumerate(lines):
        if not isinstance(line, list | tuple) or len(line) != 2:
            raise errors.InvalidInput(details={f"lines[{i}]": "expected (product_id, quantity)"})
        pid, qty = line
        if not _is_int(pid) or pid <= 0:
            raise errors.InvalidInput(details={f"lines[{i}].product_id": "a positive integer"})
        if not _is_int(qty) or not 1 <= qty <= max_qty:
            raise errors.InvalidQuantity(
                f"Quantities must be whole numbers from 1 to {max_qty}.",
                details={f"lines[{i}].quantity": f"an integer from 1 to {max_qty}"},
            )
        if pid in out:
            raise errors.InvalidInput(details={f"lines[{i}].product_id": "repeated; one line per product"})
        out[pid] = qty
    return sorted(out.items())


def _printable(value: str) -> bool:
    return value.isprintable() and value == value.strip() and bool(value)


def validate_code(code: object) -> str:
    if not isinstance(code, str) or not _printable(code) or len(code) > MAX_CODE_LENGTH:
        raise errors.InvalidInput(details={"coupon_code": f"printable text, 1 to {MAX_CODE_LENGTH} characters"})
    return code


def validate_idempotency_key(key: object) -> str:
    if not isinstance(key, str) or not _printable(key) or len(key) > MAX_KEY_LENGTH or not key.isascii():
        raise errors.InvalidInput(
            details={"idempotency_key": f"printable ASCII, 1 to {MAX_KEY_LENGTH} characters"}
        )
    return key


def validate_quantity(quantity: object, *, maximum: int) -> int:
    if not _is_int(quantity) or not 1 <= quantity <= maximum:
        raise errors.InvalidQuantity(f"Quantity must be a whole number from 1 to {maximum}.",
                                     details={"quantity": f"an integer from 1 to {maximum}"})
    return quantity
