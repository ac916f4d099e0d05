"""`manage.py shop`: the command-line twin of the admin's operator actions.

    manage.py shop restock PRODUCT QUANTITY   add stock (PRODUCT: its id or SKU): the admin's "Restock…"
    manage.py shop adjust PRODUCT DELTA --reason REASON [--note TEXT]
                                              add (DELTA > 0) or remove (< 0) units with a reason
                                              (restock, correction, damaged, lost, promotion): the
                                              admin's "Adjust stock…"; never below 0
    manage.py shop cancel ORDER               cancel an unpaid order after confirmation (--yes to skip
                                              it): "Cancel…"; stock and coupon return
    manage.py shop refund ORDER               refund a paid order after confirmation (--yes to skip it):
                                              "Refund…"; the payment goes back, stock and coupon return
    manage.py shop sales                      per product: its state (open, upcoming, ended, hidden),
                                              units sold, gross, coupons and net revenue (paid orders:
                                              what buyers paid), units per minute (the sale's last 5
                                              active minutes), units reserved (awaiting payment),
                                              refunded units and money, stock left, and their totals:
                                              the admin's Sales view (--product P ..., --stock low)
    manage.py shop drop PRODUCT... --opens WHEN [--closes WHEN]
                                              schedule or move a drop: the products are on sale from
                                              WHEN ("2026-12-01 10:00" in the shop's time zone, ISO
                                              8601 with an offset, or "now") until --closes (none:
                                              no end); the window given replaces theirs
    manage.py shop drop PRODUCT... --end      end their sale now (the admin's "End sale now")
    manage.py shop drop PRODUCT... --clear    no window: on sale whenever active
    manage.py shop drop PRODUCT... --min-account-age AGE
                                              only accounts at least AGE old may buy ("7d", "24h",
                                              "90m"; "none": any account); alone or with a window
    manage.py shop drop                       list the products with a window and where each stands
    manage.py shop line PRODUCT [--pause | --resume] [--prequeue SECONDS] [--order shuffle|fifo]
                                              the drop's line (docs/design.md, "The line"): places,
                                              waiting, let through, now serving, finished, lapsed,
                                              the window, drain rate, estimated wait at the back,
                                              the sold-out cut, units open; pause or resume it, set
                                              its pre-queue window and order
    manage.py shop signups [--minutes N]      per minute of the last N (60): accounts created, API
                                              tokens created, tokens made within 60 s of their
                                              account's sign-up (the admin's user list)

Each calls what the admin calls (shop.services restock / adjust_stock / cancel_order / refund_order,
under the same locks; schedule_drop / end_drop / clear_drop; shop.selectors.product_sales and
sales_totals) and leaves the same audit: its actor on the stock ledger rows, the refund and the
drop log, "cli:<user>@<host>" here (`--actor NAME`: "cli:NAME") where the admin writes
"admin:<username>". A refusal of the service (a paid order cancelled, a quantity out of range, a
busy lock, a drop closing before it opens, a time that cannot be read) is a CommandError with the
service's message: exit status 1. `--json`:
machine-readable output, a refusal too ({"error": {"code", "message", "details"}}). Like
`manage.py locks`, it trusts whoever may run it: shell access to a server is more than the admin's
permissions.
"""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q
from django.utils import timezone

from locks.services import cli_actor_name
from shop import errors, line
from shop.conf import shop_settings
from shop.edge import account_age
from shop.models import Order, Product, StockLedger
from shop.plumbing.clock import shop_time
from shop.reads.selectors import (
    MONEY_FIGURES,
    QUICK_TOKEN,
    RATE_WINDOW,
    SALES_FIGURES,
    STOCK_LEVELS,
    product_sales,
    sales_totals,
    signups_per_minute,
    units_per_minute,
)
from shop.services import (
    adjust_stock,
    cancel_order,
    clear_drop,
    end_drop,
    inventory,
    refund_order,
    restock,
    schedule_drop,
    steer_line,
)
from shop.services.drops import parse_time, require_account_age
from shop.templatetags.shop_tags import money

ACTOR_LENGTH = StockLedger._meta.get_field("actor").max_length


def _amount(value: Decimal) -> str:
    return str(Decimal(value).quantize(Decimal("0.01")))


def _when(value) -> str | None:
    return value.isoformat() if value is not None else None


def _product_dict(product: Product) -> dict[str, Any]:
    return {"id": product.pk, "sku": product.sku, "name": product.name, "active": product.active,
            "stock": product.stock}


def _drop_dict(product: Product) -> dict[str, Any]:
    """A product with its window and where it stands now: "upcoming", "open" or "ended"; its
    minimum account age in seconds (None: any account)."""
    age = product.min_account_age
    return {**_product_dict(product), "opens_at": _when(product.opens_at), "closes_at": _when(product.closes_at),
            "drop": product.drop_state, "min_account_age": int(age.total_seconds()) if age else None}


def _age_rule(product: Product) -> str:
    age = product.min_account_age
    return f"accounts at least {account_age.describe(age)} old" if age else "any account"


def _window(product: Product) -> str:
    """A product's drop window in words: "opens 2026-12-01 10:00 UTC, closes ... (upcoming)"."""
    if product.opens_at is None and product.closes_at is None:
        return "no window (on sale whenever active)"
    opens = f"opens {shop_time(product.opens_at)}" if product.opens_at else "open"
    closes = f"closes {shop_time(product.closes_at)}" if product.closes_at else "no end"
    return f"{opens}, {closes} ({product.drop_state})"


def _state(product: Product) -> str:
    """Where the product stands: "open", "upcoming" or "ended" (its drop), and "hidden" if not active."""
    return product.drop_state if product.active else f"hidden, {product.drop_state}"


def _order_dict(order: Order) -> dict[str, Any]:
    return {"id": order.pk, "user": order.user.get_username(), "status": order.status, "total": _amount(order.total),
            "lines": [{"product_id": line.product_id, "sku": line.product.sku, "quantity": line.quantity}
                      for line in order.lines.all()]}


class Command(BaseCommand):
    help = ("The admin's operator actions from the command line: restock, adjust, cancel, refund, sales, drop, "
            "line, signups.")

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True,
                                    metavar="{restock,adjust,cancel,refund,sales,drop,line,signups}")

        def action(name: str, help_: str, *, writes: bool = True, asks: bool = False) -> CommandParser:
            p = sub.add_parser(name, help=help_, description=help_)
            p.add_argument("--json", action="store_true", help="machine-readable output")
            if writes:
                p.add_argument("--actor", help="the name written to the audit trail, after 'cli:' (default: "
                                               "user@host)")
            if asks:
                p.add_argument("--yes", action="store_true", help="do it without asking (needed with --json)")
            return p

        p = action("restock", "add QUANTITY units to PRODUCT's stock (the admin's Restock…)")
        p.add_argument("product", help="the product's id or SKU")
        p.add_argument("quantity", type=int, help="units to add")
        p = action("adjust", "add or remove units of PRODUCT's stock, with a reason (the admin's Adjust stock…)")
        p.add_argument("product", help="the product's id or SKU")
        p.add_argument("delta", type=int, help="units to add (5) or remove (-5); never below 0")
        p.add_argument("--reason", required=True,
                       help="why: " + ", ".join(f"{r} ({'adds' if way > 0 else 'removes' if way < 0 else 'either'})"
                                                for r, way in inventory.ADJUSTMENT_REASONS.items()))
        p.add_argument("--note", default="", help=f"a few words for the ledger (at most {inventory.MAX_NOTE_LENGTH})")
        for name, what in (("cancel", "cancel an unpaid order: its stock and coupon return (the admin's Cancel…)"),
                           ("refund", "refund a paid order: the payment goes back, its stock and coupon return "
                                      "(the admin's Refund…)")):
            p = action(name, what, asks=True)
            p.add_argument("order", type=int, help="the order's id")
            if name == "cancel":
                p.add_argument("--reason", default="", help="why, in words for the buyer (their mail quotes it)")
        p = action("sales", "units sold, net revenue, units per minute (last 5 minutes), reserved and refunded "
                            "units and stock per product, and their totals (the admin's Sales view)", writes=False)
        p.add_argument("--product", action="extend", nargs="+", default=[], metavar="PRODUCT",
                       help="only these products (ids or SKUs)")
        p.add_argument("--stock", choices=list(STOCK_LEVELS), help="only sold out, low or in-stock products")
        p = action("drop", "schedule, move, end or clear the drop window of PRODUCTs (the admin's product "
                           "form and actions); without products: list the products with a window")
        p.add_argument("products", nargs="*", metavar="PRODUCT", help="the products' ids or SKUs")
        p.add_argument("--opens", metavar="WHEN", help='on sale from WHEN: "2026-12-01 10:00" (the shop\'s time '
                                                       'zone), ISO 8601 with an offset, or "now"')
        p.add_argument("--closes", metavar="WHEN", help="the sale ends at WHEN (default: no end)")
        p.add_argument("--end", action="store_true", help="end their sale now")
        p.add_argument("--clear", action="store_true", help="remove their window: on sale whenever active")
        p.add_argument("--min-account-age", metavar="AGE", help='only accounts at least AGE old may buy: "7d", '
                                                                '"24h", "90m", "45s"; "none": any account')
        p = action("line", "the line of PRODUCT's drop; pause or resume it, its pre-queue window and order",
                   writes=False)
        p.add_argument("product", help="the product's id or SKU")
        p.add_argument("--pause", action="store_true", help="let nobody new through (places are kept)")
        p.add_argument("--resume", action="store_true", help="let buyers through again")
        p.add_argument("--prequeue", type=int, metavar="SECONDS", help="buyers join this long before the opening")
        p.add_argument("--order", choices=["shuffle", "fifo"], help="the pre-queue's order at the opening")
        p = action("signups", "accounts and API tokens created per minute, and tokens made within "
                              f"{int(QUICK_TOKEN.total_seconds())} s of sign-up (the admin's user list)", writes=False)
        p.add_argument("--minutes", type=int, default=60, help="how far back (1 to 1440; default 60)")

    def handle(self, *args: Any, **opts: Any) -> None:
        action = opts["action"]
        try:
            if action == "sales":
                self._sales(opts)
                return
            if action == "line":
                self._line(opts)
                return
            if action == "signups":
                self._signups(opts)
                return
            if action == "drop" and not opts["products"]:
                if (opts["opens"] is not None or opts["closes"] is not None or opts["end"] or opts["clear"]
                        or opts["min_account_age"] is not None):
                    raise CommandError("drop: name the products (ids or SKUs)")
                self._drops(opts)
                return
            actor = self._actor(opts)
            if action == "restock":
                self._restock(opts, actor)
            elif action == "adjust":
                self._adjust(opts, actor)
            elif action == "drop":
                self._drop(opts, actor)
            else:
                self._operate(opts, actor)
        except errors.ShopError as exc:
            if opts["json"]:
                self.stdout.write(json.dumps({"error": exc.as_dict()}, indent=2, default=str))
            raise CommandError(exc.message) from exc

    def _actor(self, opts: dict[str, Any]) -> str:
        """'cli:' and who: the name given, or the OS user at this host (as `manage.py locks` writes)."""
        if opts["actor"] and len(f"cli:{opts['actor']}") > ACTOR_LENGTH:
            raise CommandError(f"--actor: at most {ACTOR_LENGTH - len('cli:')} characters")
        return f"cli:{opts['actor'] or cli_actor_name()}"[:ACTOR_LENGTH]

    def _product(self, ref: str) -> Product:
        product = None
        if ref.isdigit():
            product = Product.objects.filter(pk=int(ref)).first()
        product = product or Product.objects.filter(sku=ref).first()
        if product is None:
            raise errors.UnknownProduct(f"No product {ref!r} (give its id or SKU).", details={"product": ref})
        return product

    def _line(self, opts: dict[str, Any]) -> None:
        if opts["pause"] and opts["resume"]:
            raise CommandError("line: --pause or --resume, not both")
        product = steer_line(product=self._product(opts["product"]),
                             paused=True if opts["pause"] else False if opts["resume"] else None,
                             prequeue_seconds=opts["prequeue"], order=opts["order"])
        config = line.config_of(product)
        if config is None:
            raise errors.InvalidInput(f"{product.name} has no drop, so no line (schedule one: shop drop).",
                                      details={"product_id": product.pk})
        found = line.status(config)
        shown = {"product_id": product.pk, "drop": product.opens_at.isoformat(), "opened": found.opened,
                 "paused": product.line_paused, "prequeue_seconds": product.line_prequeue_seconds,
                 "order": product.line_order, "places": found.places, "waiting": found.waiting,
                 "let_through": found.in_turn, "prequeue": found.prequeue, "now_serving": found.now_serving,
                 "finished": found.finished, "lapsed": found.lapsed, "window": int(shop_settings.LINE_WINDOW),
                 "rate": found.rate, "wait_at_back": round(found.wait_at_back, 2), "cut": found.cut is not None,
                 "units": found.units, "sold_out": found.sold_out}
        if opts["json"]:
            self.stdout.write(json.dumps(shown, indent=2))
            return
        state = "paused" if product.line_paused else "open" if found.opened else "pre-queue"
        self.stdout.write(
            f"{product.name} ({product.sku}), drop {shop_time(product.opens_at)}: line {state}\n"
            f"  places {found.places}, waiting {found.waiting}, let through {found.in_turn} of "
            f"{shown['window']}, pre-queue {found.prequeue} ({product.line_order}, "
            f"{product.line_prequeue_seconds} s before)\n"
            f"  now serving place {found.now_serving}; finished {found.finished} (lapsed {found.lapsed}); "
            f"{found.rate:.1f} a second; wait at the back about {found.wait_at_back:.0f} s\n"
            f"  units open (stock and unpaid orders) {'?' if found.units is None else found.units}"
            f"{'; sold-out cut in force' if found.cut is not None else ''}"
            f"{'; sold out' if found.sold_out else ''}")

    # --- writes --------------------------------------------------------------------------------
    def _restock(self, opts: dict[str, Any], actor: str) -> None:
        product = restock(product=self._product(opts["product"]), quantity=opts["quantity"], actor=actor)
        if opts["json"]:
            self.stdout.write(json.dumps({"product": _product_dict(product), "added": opts["quantity"],
                                          "actor": actor}, indent=2))
            return
        self.stdout.write(self.style.SUCCESS(f"{product.name} ({product.sku}): +{opts['quantity']}, "
                                             f"stock now {product.stock}."))

    def _adjust(self, opts: dict[str, Any], actor: str) -> None:
        done = adjust_stock(product=self._product(opts["product"]), delta=opts["delta"], reason=opts["reason"],
                            note=opts["note"], actor=actor)
        product = done.product
        if opts["json"]:
            self.stdout.write(json.dumps({"product": _product_dict(product), "delta": done.delta, "reason": done.reason,
                                          "note": done.note, "before": done.before, "after": done.after,
                                          "actor": actor}, indent=2))
            return
        label = StockLedger.Reason(done.reason).label
        self.stdout.write(self.style.SUCCESS(f"{product.name} ({product.sku}): {done.delta:+d} ({label}), "
                                             f"stock {done.before} -> {done.after}."))

    def _drop(self, opts: dict[str, Any], actor: str) -> None:
        """At most one of: a window (--opens and/or --closes), --end, --clear; then the service,
        once; and/or --min-account-age (read first: an age that cannot be read writes nothing)."""
        given = [what for what, on in (("--opens/--closes", opts["opens"] is not None or opts["closes"] is not None),
                                       ("--end", opts["end"]), ("--clear", opts["clear"])) if on]
        aged = opts["min_account_age"] is not None
        if len(given) > 1 or not (given or aged):
            raise CommandError("drop: give --opens WHEN [--closes WHEN], or --end, or --clear, and/or "
                               "--min-account-age AGE" + (f" (not {' and '.join(given)})" if given else ""))
        age = account_age.parse_age(opts["min_account_age"]) if aged else None
        products = [self._product(ref) for ref in opts["products"]]
        changed, done = products, {p.pk: "" for p in products}
        if opts["end"]:
            before = {p.pk: p.drop_state for p in products}
            changed = end_drop(products=products, actor=actor)
            done = {p.pk: "already ended" if before[p.pk] == "ended" else "ended now" for p in changed}
        elif opts["clear"]:
            changed = clear_drop(products=products, actor=actor)
            done = {p.pk: "window cleared" for p in changed}
        elif given:
            opens = parse_time(opts["opens"]) if opts["opens"] is not None else None
            closes = parse_time(opts["closes"]) if opts["closes"] is not None else None
            changed = schedule_drop(products=products, opens_at=opens, closes_at=closes, actor=actor)
            done = {p.pk: "scheduled" for p in changed}
        if aged:
            changed = require_account_age(products=products, min_account_age=age, actor=actor)
            done = {p.pk: "; ".join(filter(None, (done.get(p.pk), _age_rule(p)))) for p in changed}
        if opts["json"]:
            self.stdout.write(json.dumps({"products": [{**_drop_dict(p), "done": done[p.pk]} for p in changed],
                                          "actor": actor}, indent=2))
            return
        for p in changed:
            self.stdout.write(self.style.SUCCESS(f"{p.name} ({p.sku}): {done[p.pk]}; {_window(p)}."))

    def _drops(self, opts: dict[str, Any]) -> None:
        """Every product with a window, by opening time (those open from the start first)."""
        products = list(Product.objects.windowed()
                        .order_by("opens_at", "closes_at", "id"))
        if opts["json"]:
            self.stdout.write(json.dumps({"products": [_drop_dict(p) for p in products]}, indent=2))
            return
        self.stdout.write(self.style.MIGRATE_HEADING(f"Drops ({len(products)})"))
        if not products:
            self.stdout.write("  none: every product is on sale whenever it is active")
        for p in products:
            hidden = "" if p.active else " (hidden)"
            rule = f", {_age_rule(p)}" if p.min_account_age else ""
            self.stdout.write(f"{p.pk:>6} {p.sku[:16]:<16} {(p.name + hidden)[:32]:<32} {_window(p)}{rule}")

    def _operate(self, opts: dict[str, Any], actor: str) -> None:
        """Cancel or refund: say the order's state, ask (unless --yes), then the service, once."""
        action = opts["action"]
        order = (Order.objects.select_related("user").prefetch_related("lines__product")
                 .filter(pk=opts["order"]).first())
        if order is None:
            raise errors.OrderNotFound(f"No order #{opts['order']}.", details={"order_id": opts["order"]})
        allowed = order.operator_action == action
        if not opts["yes"] and allowed:  # a refusal needs no question: the service says why
            if opts["json"]:
                raise CommandError(f"{action} with --json needs --yes (no question can be asked)")
            self._confirm(order, action)
        service, done = ((cancel_order, "cancelled; stock and coupon returned") if action == "cancel" else
                         (refund_order, "refunded; the payment goes back, stock and coupon returned"))
        order = service(order=order, actor=actor, **({"reason": opts["reason"]} if action == "cancel" else {}))
        if opts["json"]:
            order = Order.objects.select_related("user").prefetch_related("lines__product").get(pk=order.pk)
            self.stdout.write(json.dumps({"order": _order_dict(order), "actor": actor}, indent=2))
            return
        self.stdout.write(self.style.SUCCESS(f"Order #{order.pk} {done}."))

    def _confirm(self, order: Order, action: str) -> None:
        lines = ", ".join(f"{line.quantity} x {line.product.name}" for line in order.lines.all())
        self.stdout.write(f"Order #{order.pk} of {order.user.get_username()} is "
                          f"{order.get_status_display().lower()}: {money(order.total)} ({lines}).")
        what = ("Its stock and coupon return." if action == "cancel"
                else "The payment goes back; its stock and coupon return.")
        if not sys.stdin.isatty():  # a script: a question nobody can answer would only garble its output
            raise CommandError(f"not {'cancelled' if action == 'cancel' else 'refunded'}: no terminal to ask on "
                               f"(add --yes to {action} without asking)")
        try:
            answer = input(f"{action.capitalize()} it? {what} [y/N] ")
        except EOFError:  # the terminal closed: end the prompt's line before the error
            self.stdout.write("")
            answer = ""
        if answer.strip().lower() not in {"y", "yes"}:
            raise CommandError(f"not {'cancelled' if action == 'cancel' else 'refunded'}")

    # --- sign-ups and API tokens (the admin's user list) -----------------------------------------
    def _signups(self, opts: dict[str, Any]) -> None:
        minutes = opts["minutes"]
        if not 1 <= minutes <= 24 * 60:
            raise CommandError("--minutes: from 1 to 1440")
        rows = signups_per_minute(now=timezone.now(), minutes=minutes)
        totals = {k: sum(r[k] for r in rows) for k in ("accounts", "tokens", "quick_tokens")}
        if opts["json"]:
            self.stdout.write(json.dumps({
                "minutes": minutes, "quick_token_seconds": int(QUICK_TOKEN.total_seconds()),
                "per_minute": [{**r, "minute": r["minute"].isoformat()} for r in rows], "totals": totals}, indent=2))
            return
        self.stdout.write(self.style.MIGRATE_HEADING(f"Sign-ups and API tokens, last {minutes} minutes"))
        self.stdout.write(f"{'minute':<17} {'accounts':>8} {'tokens':>8} {'quick':>8}")
        for r in rows:
            self.stdout.write(f"{shop_time(r['minute'])[:16]:<17} {r['accounts']:>8} {r['tokens']:>8} "
                              f"{r['quick_tokens']:>8}")
        self.stdout.write(f"{'total':<17} {totals['accounts']:>8} {totals['tokens']:>8} {totals['quick_tokens']:>8}")

    # --- the Sales view ------------------------------------------------------------------------
    def _sales(self, opts: dict[str, Any]) -> None:
        products = Product.objects.all()
        if opts["product"]:
            ids = [int(ref) for ref in opts["product"] if ref.isdigit()]
            products = products.filter(Q(pk__in=ids) | Q(sku__in=opts["product"]))
            found = {str(p.pk) for p in products} | {p.sku for p in products}
            if missing := [ref for ref in opts["product"] if ref not in found]:
                raise errors.UnknownProduct(f"No product {', '.join(map(repr, missing))} (give ids or SKUs).",
                                            details={"products": missing})
        selected = product_sales(stock=opts["stock"], products=products)
        rows = list(selected)
        totals = sales_totals(products=selected)
        minutes = int(RATE_WINDOW.total_seconds() // 60)
        if opts["json"]:
            def figures(source: dict[str, Any]) -> dict[str, Any]:
                return {**{f: _amount(source[f]) if f in MONEY_FIGURES else source[f]
                           for f in SALES_FIGURES if f != "rate"},
                        "units_per_minute": str(units_per_minute(source["rate"]))}

            self.stdout.write(json.dumps({
                "stock": opts["stock"], "rate_window_minutes": minutes,
                "products": [{**_drop_dict(p), "state": _state(p), "price": _amount(p.price),
                              **figures({f: getattr(p, f) for f in SALES_FIGURES})} for p in rows],
                "totals": {"products": totals["products"], "stock": totals["stock"], **figures(totals)},
            }, indent=2))
            return
        level = f", {STOCK_LEVELS[opts['stock']].lower()}" if opts["stock"] else ""
        self.stdout.write(self.style.MIGRATE_HEADING(f"Sales by product ({len(rows)}{level})"))
        if not rows:
            self.stdout.write("  none")
            return
        # The state has a column of its own: appended to the name, it was cut off with long names.
        self.stdout.write(f"{'id':>6} {'sku':<16} {'name':<28} {'state':<16} {'price':>12} {'stock':>8} {'sold':>8} "
                          f"{'late':>6} {'gross':>14} {'coupons':>12} {'net revenue':>14} {'units/min':>9} "
                          f"{'reserved':>8} {'refunded':>8} {'paid back':>12}")
        for p in rows:
            self.stdout.write(f"{p.pk:>6} {p.sku[:16]:<16} {p.name[:28]:<28} {_state(p):<16} {money(p.price):>12} "
                              f"{p.stock:>8} {p.units_sold:>8} {p.units_paid_late:>6} {money(p.gross):>14} "
                              f"{money(p.coupons):>12} {money(p.revenue):>14} {units_per_minute(p.rate):>9} "
                              f"{p.units_reserved:>8} {p.units_refunded:>8} {money(p.refunded):>12}")
        self.stdout.write(f"{'total':>6} {'':<16} {'':<28} {'':<16} {'':>12} {totals['stock']:>8} "
                          f"{totals['units_sold']:>8} {totals['units_paid_late']:>6} {money(totals['gross']):>14} "
                          f"{money(totals['coupons']):>12} {money(totals['revenue']):>14} "
                          f"{units_per_minute(totals['rate']):>9} {totals['units_reserved']:>8} "
                          f"{totals['units_refunded']:>8} {money(totals['refunded']):>12}")
        self.stdout.write(f"Net revenue: what buyers paid (coupons spread over an order's lines, to the cent); gross: "
                          f"list amounts; coupons: gross less net; paid back: refunded; late: sold units paid after "
                          f"the sale's end (ordered before it). Units/min: orders that still hold their stock, over "
                          f"the last {minutes} minutes of the sale's own active time.")
