"""Demo data for `./dev.sh run`: a small catalog, a few coupons, a demo user and an admin.

Idempotent: running it again changes nothing that exists (stock is never reset: it is only
ever changed through the services).

It creates the superuser admin/admin, so it runs only when asked for explicitly: SEED_DEMO=1
in the environment (`./dev.sh run` and docker-compose on a laptop set it; images never do).
"""

import os
from datetime import timedelta
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from shop.models import Coupon, Product
from shop.services.inventory import open_stock

PRODUCTS = [
    ("FLASH-001", "Limited sneaker drop", "The last 100 pairs. One size fits the queue.", "129.00", 100),
    ("FLASH-002", "Mechanical keyboard", "Hot-swappable, tactile, loud enough for a flash sale.", "89.00", 50),
    ("FLASH-003", "Noise-cancelling headphones", "Silence the thundering herd.", "199.00", 25),
    ("FLASH-004", "Espresso grinder", "Conical burrs, 40 settings.", "149.00", 10),
    ("FLASH-005", "Signed poster", "Only three exist.", "39.00", 3),
    ("FLASH-006", "Travel mug", "Keeps coffee hot through a 3 s lock wait.", "19.00", 500),
]
COUPONS = [
    ("WELCOME10", "10 off any order", "10.00", 1000),
    ("FLASH50", "50 off, first 50 shoppers only", "50.00", 50),
    ("LAST5", "5 off, five left", "5.00", 5),
]


class Command(BaseCommand):
    help = "Create demo products, coupons, user demo/demo and superuser admin/admin (idempotent)."

    def handle(self, *args, **options) -> None:
        if os.environ.get("SEED_DEMO", "").strip().lower() not in {"1", "true", "yes", "on"}:
            raise CommandError("seed_demo creates the superuser admin/admin: set SEED_DEMO=1 to really do it "
                               "(never on a server anyone else can reach).")
        User = get_user_model()
        created = 0
        with transaction.atomic():
            for sku, name, description, price, stock in PRODUCTS:
                product, new = Product.objects.get_or_create(
                    sku=sku, defaults={"name": name, "description": description, "price": Decimal(price),
                                       "stock": stock})
                if new:
                    open_stock(product=product, actor="seed_demo")
                created += new
            now = timezone.now()
            for code, description, discount, total in COUPONS:
                _, new = Coupon.objects.get_or_create(
                    code=code, defaults={"description": description, "discount": Decimal(discount), "total": total,
                                         "remaining": total, "valid_from": now - timedelta(days=1),
                                         "valid_until": now + timedelta(days=365)})
                created += new
            if not User.objects.filter(username="admin").exists():
                User.objects.create_superuser("admin", "admin@example.com", "admin")
                created += 1
            if not User.objects.filter(username="demo").exists():
                User.objects.create_user("demo", "demo@example.com", "demo")
                created += 1
        self.stdout.write(f"demo data ready ({created} created)")
