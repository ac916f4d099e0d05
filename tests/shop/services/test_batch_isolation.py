"""Invariant I9: a request in a batch is answered on its own merits.

One buyer's bad request (a key that MySQL and Python compared differently, a row that cannot be
written) must be refused alone; every other request in its batch is committed as usual.
"""

from __future__ import annotations

import MySQLdb
import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections

from locks import Lock
from shop import errors
from shop.models import Order
from shop.plumbing import hooks
from shop.plumbing.lock_names import product_lock
from shop.services import cancel_order, place_order
from tests.helpers import make_users, order_of, run_processes
from tests.locks.conftest import FORK, wait_until_queued
from tests.shop.services.test_combining import assert_books

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.usefixtures("flavour")]


@pytest.fixture(autouse=True)
def _combining(settings):
    settings.SHOP = {**getattr(settings, "SHOP", {}), "COMBINING": True}


def test_idempotency_keys_compare_exactly_in_mysql_python_and_redis(user, make_product):
    """One rule everywhere: keys are case- and byte-exact (binary collation)."""
    p = make_product(stock=10)
    first = order_of(place_order(user=user, lines=[(p.pk, 1)], idempotency_key="Key-1"))
    placed = place_order(user=user, lines=[(p.pk, 1)], idempotency_key="key-1")
    other = order_of(placed)
    assert other.pk != first.pk and not placed.replayed
    again = order_of(place_order(user=user, lines=[(p.pk, 1)], idempotency_key="KEY-1"))
    assert again.pk not in (first.pk, other.pk)
    assert place_order(user=user, lines=[(p.pk, 1)], idempotency_key="key-1").order_id == other.pk
    assert Order.objects.filter(user=user, idempotency_key="key-1").get().pk == other.pk
    assert_books([p.pk], {p.pk: 10}, [first.pk, other.pk, again.pk])


def _keyless_buyer(user_id: int, product_id: int, orders: int) -> dict:
    user = get_user_model().objects.get(pk=user_id)
    told: dict[str, list] = {"placed": [], "refused": []}
    for _ in range(orders):
        try:
            told["placed"].append(place_order(user=user, lines=[(product_id, 1)]).order_id)
        except errors.ShopError as exc:
            told["refused"].append(exc.code)
    return told


def _key_variant_sender(user_id: int, product_id: int, rounds: int) -> dict:
    """The attacker: case variants of its earlier key, and each variant twice (a duplicate)."""
    user = get_user_model().objects.get(pk=user_id)
    told: dict[str, list] = {"placed": [], "refused": []}
    for i in range(rounds):
        variant = "".join(c.upper() if (i >> j) & 1 else c for j, c in enumerate("drop-key"))
        for _ in range(2):
            try:
                told["placed"].append(place_order(user=user, lines=[(product_id, 1)], idempotency_key=variant).order_id)
            except errors.ShopError as exc:
                told["refused"].append(exc.code)
    return told


def test_key_case_variants_never_fail_other_buyers_in_the_batch(make_product):
    p = make_product(stock=5000)
    buyers = make_users(8)
    [attacker] = make_users(1, prefix="attacker")
    earlier = order_of(place_order(user=attacker, lines=[(p.pk, 1)], idempotency_key="drop-key"))
    cancel_order(order=earlier, actor=attacker, unpaid_only=True)
    def run(kind: str, uid: int, n: int) -> tuple[str, dict]:
        return kind, (_keyless_buyer if kind == "buyer" else _key_variant_sender)(uid, p.pk, n)

    results = run_processes(
        run,
        [("buyer", u.pk, 25) for u in buyers] + [("attacker", attacker.pk, 40), ("attacker", attacker.pk, 40)],
    )
    keyless = [told for kind, told in results if kind == "buyer"]
    refused = [code for told in keyless for code in told["refused"]]
    assert refused == [], f"keyless buyers were refused: {sorted(set(refused))}"
    assert sum(len(told["placed"]) for told in keyless) == 8 * 25
    # The attacker's variants are distinct keys (exact comparison): each placed at most once.
    attacks = [told for kind, told in results if kind == "attacker"]
    keys = list(Order.objects.filter(user=attacker).exclude(pk=earlier.pk).values_list("idempotency_key", flat=True))
    assert len(keys) == len(set(keys)) == len({k for k in keys})
    assert set(keys) <= {"".join(c.upper() if (i >> j) & 1 else c for j, c in enumerate("drop-key"))
                         for i in range(40)}
    seen = {oid for told in keyless + attacks for oid in told["placed"]} | {earlier.pk}
    assert_books([p.pk], {p.pk: 5000}, seen)


def _delete_user_row(user_id: int) -> None:
    """From a connection of its own (committed at once): the account disappears mid-batch."""
    db = connection.settings_dict
    raw = MySQLdb.connect(host=db["HOST"] or "127.0.0.1", port=int(db["PORT"] or 3306), user=db["USER"],
                          passwd=db["PASSWORD"], db=db["NAME"], autocommit=True)
    try:
        raw.cursor().execute("DELETE FROM auth_user WHERE id = %s", [user_id])
    finally:
        raw.close()


def _gated_buyer(user_id: int, product_id: int, victim_id: int | None, queue) -> None:
    """A forked buyer; with `victim_id` it is the combiner and deletes that account just before
    its batch writes (the victim's request is already in the batch)."""
    if victim_id is not None:
        def hook(at: str, holds: dict) -> None:
            if at == "before_update" and hooks.checkout_hook is not None:
                hooks.checkout_hook = None
                _delete_user_row(victim_id)

        hooks.checkout_hook = hook
    user = get_user_model().objects.get(pk=user_id)
    try:
        queue.put(("placed", place_order(user=user, lines=[(product_id, 1)]).order_id))
    except errors.ShopError as exc:
        queue.put((exc.code, None))
    finally:
        connections.close_all()


def test_a_request_whose_rows_cannot_be_written_is_refused_alone(make_product):
    """An IntegrityError tied to one request (its account was deleted while it queued): that
    request alone is refused with a typed error; the others in its batch are placed."""
    p = make_product(stock=100)
    users = make_users(4, prefix="gated")
    name = product_lock(p.pk)
    gate = Lock(name, ttl=30.0)
    gate.acquire()
    connections.close_all()
    queue = FORK.Queue()
    procs = []
    for i, u in enumerate(users):
        proc = FORK.Process(target=_gated_buyer, args=(u.pk, p.pk, users[1].pk if i == 0 else None, queue))
        proc.start()
        wait_until_queued(name, i + 1)
        procs.append(proc)
    gate.release()
    told = sorted((queue.get(timeout=20) for _ in procs), key=lambda t: t[0])
    for proc in procs:
        proc.join(10)
    kinds = [kind for kind, _ in told]
    assert kinds.count("placed") == 3, told
    assert kinds.count("order_not_writable") == 1, told
    assert_books([p.pk], {p.pk: 100}, [oid for kind, oid in told if kind == "placed"])
