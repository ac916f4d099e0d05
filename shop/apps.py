from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "shop"
    verbose_name = "Shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The shop's scheduled jobs (run by `manage.py run_jobs` on every server).
        from django.conf import settings
        from django.db.models.signals import post_save

        from shop import checks, jobs, tokens  # noqa: F401

        post_save.connect(tokens.revoke_on_password_change, sender=settings.AUTH_USER_MODEL,
                          dispatch_uid="shop.tokens.revoke_on_password_change")
