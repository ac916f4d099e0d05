from django.apps import AppConfig
from django.db.backends.signals import connection_created


class ShopConfig(AppConfig):
    name = "shop"
    verbose_name = "Shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.models.signals import post_save

        from shop.api import tokens
        from shop.line import board

        # The shop's scheduled jobs (run by `manage.py run_jobs` on every server) and system checks.
        from shop.ops import checks, jobs, metrics  # noqa: F401
        from shop.plumbing import stale_transactions

        # The lines' gauges, read from Redis when /metrics is scraped.
        metrics.add_scrape_collector(board.LineCollector())
        # Service transactions are bounded; everything else on a pooled connection is not.
        connection_created.connect(stale_transactions.install, dispatch_uid="shop.unbound_other_work")
        # A new password ends the API tokens issued under the old one.
        post_save.connect(tokens.revoke_on_password_change, sender=settings.AUTH_USER_MODEL,
                          dispatch_uid="shop.tokens.revoke_on_password_change")
        # Accounts and API tokens created: counted for the operator (docs/metrics.md, Bots).
        post_save.connect(metrics.account_created, sender=settings.AUTH_USER_MODEL,
                          dispatch_uid="shop.metrics.account_created")
        post_save.connect(metrics.token_created, sender="shop.ApiToken", dispatch_uid="shop.metrics.token_created")
