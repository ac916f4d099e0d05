"""Shop fixtures: real MariaDB rows, real Redis locks."""

from __future__ import annotations

import itertools
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from loadtest import appservers
from shop.models import Coupon, Product

_seq = itertools.count(1)


@pytest.fixture
def make_product(db):
    def make(stock: int = 10, price: str = "10.00", active: bool = True) -> Product:
        n = next(_seq)
        return Product.objects.create(sku=f"SKU-{n}", name=f"Product {n}", price=Decimal(price), stock=stock,
                                      active=active)

    return make


@pytest.fixture
def make_coupon(db):
    def make(total: int = 10, discount: str = "5.00", **kwargs) -> Coupon:
        n = next(_seq)
        now = timezone.now()
        defaults = {"valid_from": now - timedelta(days=1), "valid_until": now + timedelta(days=1)}
        return Coupon.objects.create(code=f"C{n}", discount=Decimal(discount), total=total, remaining=total,
                                     **{**defaults, **kwargs})

    return make


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user(f"shopper-{next(_seq)}", password="pw-not-used")


@pytest.fixture
def other_user(db):
    return get_user_model().objects.create_user(f"shopper-{next(_seq)}", password="pw-not-used")


@pytest.fixture(params=["mariadb", "mysql8"])
def flavour(request):
    """Run the test twice: on MariaDB as it is, and with the connection dressed as MySQL 8.4 (no
    INSERT ... RETURNING, no idle_transaction_timeout, so stale transactions in kill mode;
    loadtest/mysql8). Forked processes inherit the dress."""
    from django.db import connection

    from loadtest import mysql8

    if request.param == "mariadb":
        yield request.param
        return
    with mysql8.emulate(connection):
        yield request.param


@pytest.fixture
def mysql8():
    """The connection dressed as MySQL 8.4 for this test only (see `flavour`)."""
    from django.db import connection

    from loadtest import mysql8 as emulation

    with emulation.emulate(connection):
        yield


@pytest.fixture
def server():
    """A real gunicorn with the shop's worker: one worker of 4 threads (the overload and triage tests)."""
    connections.close_all()
    small = appservers.AppServer(workers=1, threads=4)
    small.start()
    yield small
    small.stop()


@pytest.fixture
def drop(make_product):
    """make(stock=10, **fields): a product whose drop opened a minute ago (so it has a line)."""
    from shop import line

    def make(stock: int = 10, **fields) -> Product:
        p = make_product(stock=stock)
        fields.setdefault("opens_at", timezone.now() - timedelta(minutes=1))
        Product.objects.filter(pk=p.pk).update(**fields)
        line.forget()
        p.refresh_from_db()
        return p

    return make


@pytest.fixture
def admin_client():
    """A client logged in as the superuser "root" (the admin's actor is then `admin:root`)."""
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client
