"""The shop in the Django admin. Stock and coupon counts change only through the services.

The change forms keep `stock` and `remaining` read-only (fences are not shown), and saves write only the
fields that changed (`update_fields`), so an operator renaming a product can never write back a
stock value read minutes ago. Restock, adjust stock and cancel are custom admin views (not actions
or change forms, which Django wraps in a transaction) that call the services under the same locks;
hiding a product (clearing Active) drops its sold-out marker under its lock once the save commits.
A paid order offers Refund, never Cancel. A product's drop window (Opens at / Closes at on its
form, the "Schedule drop…" and "End sale now" actions over the selected products) is written by
shop.services.drops, which logs who did it, as the command line's `shop drop` does.

The ModelAdmins by what they look after (`products`, `orders`, `sales`: the live pages, `records`:
read-only, on the base the lock pages share, locks/admin_base.py, and `accounts`); what they share
by kind, as django.contrib.admin splits it (`forms`, `filters`, `columns`, `exports`).
"""

from shop.admin import accounts, orders, products, records, sales  # noqa: F401  (each registers its models)
