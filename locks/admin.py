"""The lock dashboard in the admin: an index entry whose pages are live views over Redis."""

from __future__ import annotations

from functools import wraps

from django.contrib import admin
from django.urls import path
from django.views.decorators.http import require_http_methods

from locks import views
from locks.models import ForceRelease, JobRun, LockDashboard


class ReadOnlyLockAdmin(admin.ModelAdmin):
    """Staff with the model's view permission may look (as in the shop's admin; is_staff alone is
    not enough: job runs carry tracebacks); nobody edits through the admin's forms."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(LockDashboard)
class LockDashboardAdmin(ReadOnlyLockAdmin):
    """The live dashboard (`view_lockdashboard`); releasing and resetting the statistics need
    their own permissions too (see views, which check them all)."""

    def changelist_view(self, request, extra_context=None):
        return views.dashboard(request)

    def get_urls(self):
        def wrap(view):
            @wraps(view)
            def wrapper(request, *args, **kwargs):
                request.current_app = self.admin_site.name
                return self.admin_site.admin_view(view)(request, *args, **kwargs)

            return wrapper

        return [
            path("data/", wrap(views.dashboard_data), name="locks_lockdashboard_data"),
            path("events/", wrap(views.event_log), name="locks_lockdashboard_events"),
            path("release/<path:name>/", wrap(require_http_methods(["GET", "POST"])(views.force_release)),
                 name="locks_lockdashboard_release"),
            path("reset-stats/", wrap(require_http_methods(["GET", "POST"])(views.reset_stats)),
                 name="locks_lockdashboard_reset_stats"),
            *super().get_urls(),
        ]


@admin.register(ForceRelease)
class ForceReleaseAdmin(ReadOnlyLockAdmin):
    """The audit: who ended whose hold (`view_forcerelease`)."""

    list_display = ("released_at", "lock_name", "fence", "owner", "held_for", "waiters", "actor_name")
    list_filter = ("released_at",)
    search_fields = ("lock_name", "actor_name", "owner")
    readonly_fields = [f.name for f in ForceRelease._meta.fields]


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyLockAdmin):
    """Who ran each tick of each scheduled job, when, how long, and how it ended (manage.py run_jobs --list).
    `view_jobrun` only: a failed run's traceback may carry settings and data."""

    list_display = ("job", "tick", "due_at", "runner", "started_at", "duration", "outcome", "takeovers")
    list_filter = ("job", "outcome")
    search_fields = ("job", "runner")
    readonly_fields = [f.name for f in JobRun._meta.fields]
