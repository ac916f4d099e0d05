from django.apps import AppConfig


class LoadtestConfig(AppConfig):
    name = "loadtest"
    verbose_name = "Load tests"
    default_auto_field = "django.db.models.BigAutoField"
