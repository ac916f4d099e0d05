from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "shop"
    verbose_name = "Shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The shop's scheduled jobs (run by `manage.py run_jobs` on every server).
        from shop import checks, jobs  # noqa: F401
