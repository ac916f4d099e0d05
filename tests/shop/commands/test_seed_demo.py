"""seed_demo creates admin/admin: it runs only when asked for explicitly."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from shop.models import Coupon, Product

pytestmark = pytest.mark.django_db


def test_seed_demo_refuses_without_the_opt_in(monkeypatch):
    monkeypatch.delenv("SEED_DEMO", raising=False)
    with pytest.raises(CommandError, match="SEED_DEMO=1"):
        call_command("seed_demo")
    assert not get_user_model().objects.filter(username="admin").exists()
    assert not Product.objects.exists()


def test_seed_demo_with_the_opt_in_loads_the_demo(monkeypatch):
    monkeypatch.setenv("SEED_DEMO", "1")
    call_command("seed_demo")
    call_command("seed_demo")  # idempotent
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("admin")
    assert get_user_model().objects.get(username="demo").check_password("demo")
    assert Product.objects.count() == 6 and Coupon.objects.filter(code="WELCOME10").exists()
