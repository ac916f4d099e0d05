"""Every key the shop keeps in its Redis (SHOP["REDIS_ALIAS"]), in one place.

All live under `shop:<database name>:`, so two shops (a laptop's development and test
databases, say) can share one Redis and a test run can delete exactly its own (`namespace`).
A hash tag (`{...}`) keeps the keys one Lua script touches in one Redis Cluster slot. The lock
library's keys are its own (locks/keys.py).
"""

from __future__ import annotations

import hashlib

from django.db import DEFAULT_DB_ALIAS, connections

_database: dict | None = None


def namespace() -> str:
    """`shop:<the database's name>`. The name is read from the database's settings dict, the one
    object every thread's connection shares (and the test runner renames in place), not through
    `connection`: a thread-local lookup for every key."""
    global _database
    if _database is None:
        _database = connections.settings[DEFAULT_DB_ALIAS]
    return f"shop:{_database['NAME']}"


def sold_out_marker(product_id: int) -> str:
    """Set while the product is known sold out (shop/plumbing/soldout.py)."""
    return f"{namespace()}:soldout:{{{product_id}}}"


def refill_floor(product_id: int) -> str:
    """The fence of the product's last refill: no older hold may mark it sold out again."""
    return f"{namespace()}:refilled:{{{product_id}}}"


def sold_out_index() -> str:
    """product id -> when its marker lapses: what every server reads to know what is sold out."""
    return f"{namespace()}:soldout-index"


def idempotency_record(user_id: int, key: str) -> str:
    """Set before the COMMIT of an order placed with an Idempotency-Key (the key is hashed: any text)."""
    return f"{namespace()}:idem:{user_id}:{hashlib.sha256(key.encode()).hexdigest()[:32]}"


def fence_refusals(lock: str) -> str:
    """How often a stale fence was refused under this lock name (a count for load tests)."""
    return f"{namespace()}:fence-refused:{lock}"


def holder(lock: str) -> str:
    """Kill mode: the recent holders' connections under this lock (shop/plumbing/stale_transactions.py)."""
    return f"{namespace()}:holder:{{{lock}}}"


def token_user(key_hash: str) -> str:
    """An API token's user, cached (shop/api/tokens.py)."""
    return f"{namespace()}:token:{key_hash}"


def overload_counts(bucket: int) -> str:
    """The cluster's busy and deadline counts of one 10-second bucket (shop/edge/overload.py)."""
    return f"{namespace()}:overload:{bucket}"


def line(product_id: int, drop: int) -> str:
    """The prefix of one drop's line (shop/line/): `drop` is its opens_at in unix seconds, so a
    rescheduled drop gets a new line. Its keys carry the product's hash tag, as the sold-out marker
    does: the line's script reads the marker in the same Redis Cluster slot."""
    return f"{namespace()}:line:{{{product_id}}}:{drop}"


def young_buyer(product_id: int, opens_at: int, user_id: int) -> str:
    """Set at a young account's first order request in a drop's opening window (shop/edge/account_age.py)."""
    return f"{namespace()}:young:{product_id}:{opens_at}:{user_id}"
