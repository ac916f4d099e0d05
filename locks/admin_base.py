"""The read-only admin both the lock pages and the shop's records stand on (locks never imports the shop).

Staff with a model's view permission may look; nobody adds, changes or deletes through the
admin's forms: those rows are written by the code that owns them (a lock's release, a job's run,
a service). A formatted column shows a field as its pages write it and still sorts by it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

if TYPE_CHECKING:  # generic in django-stubs only
    _ModelAdmin = admin.ModelAdmin[Any]
else:
    _ModelAdmin = admin.ModelAdmin


class ReadOnlyAdmin(_ModelAdmin):
    """Look, never edit: the view permission is needed (is_staff alone is not enough: job runs carry
    tracebacks)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


def formatted_column(field: str, description: str, render: Callable[[Any], str],
                     suffix: str) -> Callable[[Any, Model], str]:
    """A column (or read-only field) `<field>_<suffix>` showing `render(field)`, sorted by `field`."""

    @admin.display(description=description, ordering=field)
    def column(self: Any, obj: Model) -> str:
        return render(getattr(obj, field))

    column.__name__ = f"{field}_{suffix}"
    return column
