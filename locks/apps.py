from django.apps import AppConfig


class LocksConfig(AppConfig):
    name = "locks"
    verbose_name = "Locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from locks import checks  # noqa: F401  (registers the system checks)
