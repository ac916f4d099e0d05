from django.apps import AppConfig


class LocksConfig(AppConfig):
    name = "locks"
    verbose_name = "Locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks, and the locks app's own scheduled job.
        from locks import checks, jobs  # noqa: F401
