"""Input checks shared by every service: plain Python, before any lock or query."""

from __future__ import annotations

from typing import Any

from shop import errors
from shop.conf import shop_settings

MAX_CODE_LENGTH = 40
MAX_KEY_LENGTH = 128


# The largest id a product can have (a BIGINT): a larger one is no product, and no query.
MAX_ID = 2**63 - 1
# A line the caller could not even read as (product_id, quantity), with why.
Malformed = str


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def line_problems(lines: object) -> tuple[list[tuple[int, int]], dict[str, str]]:
    """The one check of an order's lines: (product id, quantity) pairs (or a `Malformed` text
    where the caller could not read one). Returns the lines, sorted by product id, and every
    problem by field ("lines[2].quantity": "an integer from 1 to 100"); lines only if none."""
    if not isinstance(lines, list | tuple) or not lines:
        return [], {"lines": "a non-empty list of {product_id, quantity}"}
    cap, max_qty = int(shop_settings.MAX_LINES_PER_ORDER), int(shop_settings.MAX_QUANTITY_PER_LINE)
    if len(lines) > cap:
        return [], {"lines": f"at most {cap} lines"}
    problems: dict[str, str] = {}
    out: dict[int, int] = {}
    for i, line in enumerate(lines):
        where = f"lines[{i}]"
        if isinstance(line, Malformed):
            problems[where] = line
            continue
        if not isinstance(line, list | tuple) or len(line) != 2:
            problems[where] = "a (product_id, quantity) pair"
            continue
        pid, qty = line
        if not _is_int(pid) or not 1 <= pid <= MAX_ID:
            problems[f"{where}.product_id"] = "a positive integer"
        elif pid in out:
            problems[f"{where}.product_id"] = "repeated; one line per product"
        if qty is None:
            problems[f"{where}.quantity"] = "required"
        elif not _is_int(qty) or not 1 <= qty <= max_qty:
            problems[f"{where}.quantity"] = f"an integer from 1 to {max_qty}"
        if _is_int(pid) and pid not in out:
            out[pid] = qty
    return ([] if problems else sorted(out.items())), problems


def refusal(problems: dict[str, str]) -> errors.InvalidInput:
    """The error for these problems: InvalidQuantity when only quantities are out of range."""
    only_quantities = all(k.endswith(".quantity") and v != "required" for k, v in problems.items())
    if only_quantities:
        max_qty = int(shop_settings.MAX_QUANTITY_PER_LINE)
        return errors.InvalidQuantity(f"Quantities must be whole numbers from 1 to {max_qty}.", details=problems)
    if set(problems) == {"lines"}:
        return errors.InvalidInput(f"An order needs 1 to {int(shop_settings.MAX_LINES_PER_ORDER)} lines.",
                                   details=problems)
    return errors.InvalidInput(details=problems)


def validate_lines(lines: object) -> list[tuple[int, int]]:
    """(product_id, quantity) pairs, sorted by product id. A product may appear once."""
    out, problems = line_problems(lines)
    if problems:
        raise refusal(problems)
    return out


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


def order_body(data: dict[str, Any]) -> tuple[list[tuple[int, int]], str | None]:
    """An API order body's lines and coupon, every problem reported at once (the lines by the
    service's one check, `line_problems`): the API's and the line's door's one reading of it."""
    problems: dict[str, str] = {}
    for key in sorted(set(data) - {"lines", "coupon_code"}):
        problems[str(key)[:50]] = "unknown field"
    lines_in = data.get("lines")
    pairs: object = lines_in
    if isinstance(lines_in, list):
        pairs = []
        for i, line in enumerate(lines_in):
            if not isinstance(line, dict):
                pairs.append(Malformed("an object {product_id, quantity}"))
                continue
            for key in sorted(set(line) - {"product_id", "quantity"}):
                problems[f"lines[{i}].{str(key)[:50]}"] = "unknown field"
            pairs.append((line.get("product_id"), line.get("quantity")))
    elif isinstance(lines_in, tuple):  # JSON gives lists; anything else is not a list of lines
        pairs = None
    lines, line_problems_found = line_problems(pairs)
    problems.update(line_problems_found)
    code = data.get("coupon_code")
    if code is not None:
        try:
            code = validate_code(code)
        except errors.InvalidInput:
            problems["coupon_code"] = f"printable text, 1 to {MAX_CODE_LENGTH} characters, or null"
    if problems:
        raise refusal(problems)
    return lines, code
