"""The `SHOP` setting, with defaults (read on every access, like `locks.conf`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Take the Redis locks. Off, the guarded UPDATE alone still prevents oversell (slower under
    # contention: every buyer queues on the hot row inside MySQL instead of in Redis).
    "USE_LOCKS": True,
    # A checkout holds its locks for milliseconds, so the lease is short and renewed by the
    # lock's watchdog while the holder lives: a killed holder (gunicorn timeout, OOM) stalls
    # its product for at most LOCK_TTL, well inside a buyer's LOCK_WAIT; a paused one loses the
    # lock after LOCK_TTL and the fence refuses its late write. LOCK_MAX_HOLD caps renewals.
    "LOCK_TTL": 1.0,  # seconds: the lease of a product/coupon lock
    "LOCK_MAX_HOLD": 30.0,  # seconds: no hold is renewed past this
    "LOCK_WAIT": 3.0,  # seconds a buyer waits for a busy product before lock_timeout
    # Input caps, shared by the services, the web forms and the API.
    "MAX_QUANTITY_PER_LINE": 100,
    "MAX_LINES_PER_ORDER": 20,
    "MAX_RESTOCK": 1_000_000,
    # Lines (products) one cart may hold: the cart lives in the session, which every request reads.
    "MAX_CART_LINES": 20,
    # Combining (shop/checkout/combining.py): an order for one product queues on the product's
    # lock, and whoever holds the lock commits everyone queued, up to COMBINE_BATCH orders, in
    # one transaction. Off: every order takes its locks and is a batch of one (multi-product
    # orders always are); the same writer either way. Env: SHOP_COMBINING=false.
    "COMBINING": True,
    "COMBINE_BATCH": 32,
    # Lanes: products share N queues (`checkout-lane:<product id mod N>`); the lane's holder takes
    # the product locks of its batch without waiting (sorted) and commits orders for several
    # products in one transaction, so a catalog of moderately busy products gets batches as large
    # as a hot product's. The product locks still cover every write; a product whose lock is busy
    # (a cart holds it) is handed back to its buyers, who take it themselves. "auto" (the
    # default): one per two CPUs of this machine (shop/plumbing/lock_names.py, `lanes`); 0: a queue per product.
    # Every app server must use the same N: set it where servers differ in size.
    # Env: SHOP_COMBINE_LANES.
    "COMBINE_LANES": "auto",
    # Overload (config/gunicorn_worker.py, shop/edge/admission.py, shop/edge/deadlines.py). A request waits for
    # a thread of its worker at most QUEUE_INTERVAL s while the queue drains now and then, and
    # QUEUE_TARGET s once a standing queue formed (CoDel); more than QUEUE_MAX requests waiting
    # (None: the worker's thread count) and a new one is answered 503 `busy` at once, without the
    # app. MAX_WAITING buyers of one process may wait in the products' lines at once (None: the
    # worker's threads minus a quarter; unbounded outside the shop's gunicorn worker).
    "QUEUE_TARGET": 0.02,
    "QUEUE_INTERVAL": 0.1,
    "QUEUE_MAX": None,
    "MAX_WAITING": None,
    # Slow clients (config/gunicorn_worker.py): the worker reads a request before it gives it a
    # thread. It must be whole within HEAD_TIMEOUT s of its connection (or, kept alive, of its
    # first byte), or the connection is closed; a head over HEAD_MAX bytes is answered 431; a body
    # up to BODY_BUFFER bytes is read too (a larger one, or chunked, by the thread). Once a worker
    # holds half its worker_connections, one client address may have HEAD_SLOTS_PER_CLIENT
    # connections still sending (0 or None: no bound): one more closes its oldest (sending for a
    # second or more). Env: SHOP_HEAD_TIMEOUT, SHOP_HEAD_SLOTS_PER_CLIENT.
    "HEAD_TIMEOUT": 5.0,
    "HEAD_SLOTS_PER_CLIENT": 16,
    "HEAD_MAX": 32 * 1024,
    "BODY_BUFFER": 64 * 1024,
    # The line of a drop (shop/line/, docs/design.md "The line"): buyers of a product with a drop
    # window take a place at their first order request and are let through to the checkout in
    # place order. LINE_WINDOW buyers of one line may be let through (and not yet answered) at
    # once, across every app server: about what the checkout finishes in a second or two (its
    # batch size times the batches it commits at once), so the checkout stays busy and nobody
    # waits inside it. A buyer let through has LINE_TURN seconds to come (more than the longest
    # Retry-After it was given, LINE_RETRY_MAX, plus a few seconds); one who never comes
    # (or whose server died mid-checkout) lapses and the line moves on. Waiting buyers are told
    # to come back after their estimated wait, at most LINE_RETRY_MAX seconds (and at least 1);
    # LINE_DEFAULT_RATE (buyers a second) estimates it until the line has drained a while.
    # Each process reads which products have a line at most every LINE_REFRESH seconds (one
    # query); the units a line can still sell (stock plus unpaid reservations) at most every
    # LINE_UNITS_REFRESH seconds (one query per line, by one process).
    # LINES off: drops sell without a line, as before it existed (to compare). Env: SHOP_LINES.
    # LINE_DOOR: the shop's worker takes an API buyer's place itself, in a thread but before
    # Django (shop/line/door.py), as of the moment it read the request, even while its queue is
    # full; off, a place is taken when the request reaches the app (to compare). Env: SHOP_LINE_DOOR.
    "LINES": True,
    "LINE_DOOR": True,
    "LINE_WINDOW": 256,
    "LINE_TURN": 8.0,
    "LINE_RETRY_MAX": 5,
    "LINE_DEFAULT_RATE": 50.0,
    # While a line's door lags behind its backlog by LINE_SETTLE_FROM seconds or more (a crowd),
    # the line lets through only places older than that door's watermark (shop/line/line.lua,
    # `advance`), so an earlier arrival it has not registered yet is not overtaken by later
    # buyers (0 or None: never).
    "LINE_SETTLE_FROM": 0.05,
    "LINE_REFRESH": 1.0,
    "LINE_UNITS_REFRESH": 1.0,
    # Payment: a new order awaits payment this long (seconds) with its stock reserved;
    # unpaid past it, the `shop.expire_unpaid` job (manage.py run_jobs) expires it and the stock
    # and coupon go back. Checked when the order is paid, so a late payment is refused.
    "PAYMENT_WINDOW": 15 * 60,
    # A refund's worker (refund_order, or the `shop.finish_refunds` job) claims the refund for this
    # long (seconds): no other worker touches it meanwhile. Longer than a provider call may take;
    # a refund whose worker died is finished by the job once the claim lapses.
    "REFUND_CLAIM": 60,
    # Mail (shop/services/emails.py) leaves through an outbox sent by the `shop.send_mail` job; a
    # mail that fails is retried with a growing delay (30 s, doubling, at most an hour) and given
    # up after this many attempts (about 2 hours with 8).
    "MAIL_ATTEMPTS": 8,
    # The admin's Sales view (Shop > Sales) calls a product with 1 to LOW_STOCK units left "low".
    "LOW_STOCK": 10,
    # Deadlock (1213), lock wait timeout (1205), stale fence or lost lock: retried this often.
    "RETRIES": 5,
    # The cache alias of the shop's own Redis (shop/plumbing/redis_keys.py: sold-out markers, idempotency
    # records, cached tokens, overload counts), apart from the lock service's (LOCKS["CACHE_ALIAS"]).
    "REDIS_ALIAS": "default",
    # Sold-out markers live there with this TTL (seconds). Services keep them exact; the TTL
    # bounds the damage of stock changed behind their back (raw SQL, a DB reset).
    "SOLDOUT_TTL": 300,
    # An order with an Idempotency-Key leaves a record in that same Redis (written before its
    # COMMIT), so the sold-out fast path knows which keys placed an order without asking MySQL.
    "IDEMPOTENCY_TTL": 24 * 3600,
    # API tokens: a verified token's user is cached this long (seconds; 0 = off). Revoking a
    # token drops it at once; deactivating a user takes effect within this time.
    "TOKEN_CACHE_TTL": 60,
    # ... and kept in each server process this long (seconds; 0 = off): a request then pays no
    # Redis round trip nor unpickling for it. A revocation reaches the revoking process at once
    # and the others within this time.
    "TOKEN_LOCAL_TTL": 1.0,
    # Orders awaiting payment one buyer may have at once (None: no limit). Without it one account
    # can reserve a whole drop for the payment window and order it again when it expires.
    # Env: SHOP_MAX_UNPAID_ORDERS (a number or "off"). Load tests switch it off for their buyers.
    "MAX_UNPAID_ORDERS": 5,
    # A holder paused past its lease (GC, SIGSTOP, a stalled VM) keeps its MySQL transaction and
    # InnoDB row locks open; the next holder would wait for the whole pause. How that transaction
    # is ended (shop/plumbing/stale_transactions.py): "timeout" (MariaDB's idle_transaction_timeout,
    # ceil(LOCK_TTL) + 1 s, no privilege needed), "kill" (the next holder KILLs the connection
    # recorded with the older fence: MySQL 8; same database user for every app server), "auto"
    # (timeout on MariaDB, kill elsewhere), or "off" (wait for the paused holder).
    "STALE_TRANSACTIONS": "auto",
    # Bots (shop/edge/account_age.py, docs/operations.md "Bots"): an account younger than
    # YOUNG_ACCOUNT_AGE seconds whose first order request for a drop comes within
    # DROP_OPENING_WINDOW seconds of its opening is counted in flashsale_drop_young_buyers_total.
    "YOUNG_ACCOUNT_AGE": 24 * 3600,
    "DROP_OPENING_WINDOW": 60,
    # Rate limits (shop/edge/ratelimits.py), "count/period" (s, m, h, d) per key; None lifts a limit.
    # settings.SHOP["RATE_LIMITS"] (or the RATE_LIMITS environment variable) overrides them one by
    # one; RATELIMIT_ENABLE=false switches them all off. Checkout is generous on purpose: a buyer
    # places a few orders a minute, and `loadtest --url` (100 users by default) must not be
    # throttled; it stops one account or token from hammering the hot product's lock.
    "RATE_LIMITS": {
        "login": "20/m",  # POST /login/, per client IP
        "login_account": "10/m",  # POST /login/, per username tried
        "signup": "10/h",  # POST /signup/, per client IP
        "password_reset": "10/h",  # POST /password-reset/ (each may send a mail), per client IP
        # ...and per address asked for (normalized, hashed), from any IP: no flooding one inbox.
        "password_reset_address": "5/h",
        "token_create": "20/h",  # new API tokens on /account/tokens/, per user
        "token_create_ip": "30/h",  # ...and per client IP, whichever accounts ask (a farm of fresh accounts)
        "coupon_claim": "30/m",  # coupon claims (web and API), per user
        "checkout": "600/m",  # orders (web and API), per user
        # Paying and cancelling (web and API), per user. Pay as generous as checkout: `loadtest
        # --url --pay 1` pays every order it places. A cancel takes the product locks to put the
        # stock back, so it is kept lower.
        "pay": "600/m",
        "cancel": "60/m",
    },
}


# Keys of SHOP that were renamed: the system check names the new one (shop.E003).
RENAMED = {"SOLDOUT_CACHE_ALIAS": "REDIS_ALIAS"}


# Django's LazySettings keeps each setting it read in its own __dict__ and drops it when that
# setting is set or the settings are overridden (`__setattr__`): read SHOP from there first. A
# read through `settings.SHOP` costs ~3 us (LazyObject.__getattribute__), and the line's door and
# the checkout read a dozen settings per order.
_read_settings: dict = object.__getattribute__(settings, "__dict__")


class ShopSettings:
    def __getattr__(self, name: str) -> Any:
        shop = _read_settings.get("SHOP")
        if shop is None:
            shop = getattr(settings, "SHOP", {})
        value = shop.get(name, _UNSET)
        if value is _UNSET:
            if name not in DEFAULTS:
                raise AttributeError(f"unknown SHOP setting {name!r}")
            return DEFAULTS[name]
        return value


_UNSET = object()


shop_settings = ShopSettings()
