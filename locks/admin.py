"""The lock dashboard in the admin: an index entry whose pages are live views over Redis."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import admin
from django.db.models import Count, Model
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.views.decorators.http import require_http_methods

from locks import formats, views
from locks.admin_base import ReadOnlyAdmin, formatted_column
from locks.models import ForceRelease, JobIdleRuns, JobRun, LockDashboard


@admin.register(LockDashboard)
class LockDashboardAdmin(ReadOnlyAdmin):
    """The live dashboard (`view_lockdashboard`); releasing and resetting the statistics need
    their own permissions too (see views, which check them all)."""

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return views.dashboard(request)

    def get_urls(self) -> list[URLPattern]:
        def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
            @wraps(view)
            def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
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


def when_column(field: str, description: str) -> Callable[[Any, Model], str]:
    """A read-only column or field `<field>_text` showing a time as the lock pages write it (locks/formats.py)."""
    return formatted_column(field, description, formats.when, "text")


def duration_column(field: str, description: str) -> Callable[[Any, Model], str]:
    return formatted_column(field, description, formats.duration, "text")


class LockListMedia:
    """The lists' long host:pid values wrap, so their tables fit 1280 px (locks/dashboard.css)."""

    class Media:
        css = {"all": ["locks/dashboard.css"]}


@admin.register(ForceRelease)
class ForceReleaseAdmin(LockListMedia, ReadOnlyAdmin):
    """The audit: who ended whose hold (`view_forcerelease`)."""

    list_display = ("released_at_text", "lock_name", "fence", "owner_text", "held_for_text", "waiters", "by")
    date_hierarchy = "released_at"  # above the list, not a filter column beside it: the columns fit 1280 px
    search_fields = ("lock_name", "actor_name", "owner")
    fields = readonly_fields = ("released_at_text", "lock_name", "fence", "owner", "held_for_text", "waiters",
                                "actor", "actor_name")
    released_at_text = when_column("released_at", "Released")
    held_for_text = duration_column("held_for", "Held for")

    @admin.display(description="Holder", ordering="owner")
    def owner_text(self, obj: ForceRelease) -> str:
        return obj.owner

    @admin.display(description="By", ordering="actor_name")
    def by(self, obj: ForceRelease) -> str:
        return obj.actor_name


@admin.register(JobRun)
class JobRunAdmin(LockListMedia, ReadOnlyAdmin):
    """Who ran each tick of each scheduled job, when, how long, and how it ended (manage.py run_jobs --list).
    `view_jobrun` only: a failed run's traceback may carry settings and data. The list leaves the tick and the
    start out (the run's page has them): its columns fit 1280 px beside the filters."""

    list_display = ("job", "due_at_text", "runner", "duration_text", "outcome", "takeovers")
    list_filter = ("job", "outcome", "idle")
    search_fields = ("job", "runner")
    change_list_template = "admin/locks/jobrun_change_list.html"  # beside the others: the wheel ships that folder

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Above the runs: per job, its idle runs (counted, and those still kept as rows): only
        runs that did something or failed are kept for long (locks.jobs.fold_idle_runs)."""
        kept = dict(JobRun.objects.filter(idle=True).values_list("job").annotate(n=Count("pk"))
                    .values_list("job", "n"))
        counted = {c.job: c for c in JobIdleRuns.objects.all()}
        idle = [{"job": job, "runs": (counted[job].runs if job in counted else 0) + kept.get(job, 0)}
                for job in sorted(set(kept) | set(counted))]
        return super().changelist_view(request, {"idle_runs": idle, **(extra_context or {})})
    fields = readonly_fields = ("job", "tick", "due_at_text", "runner", "fence", "started_at_text", "lease_until_text",
                                "finished_at_text", "duration_text", "outcome", "takeovers", "taken_over_from",
                                "detail", "error")
    due_at_text = when_column("due_at", "Due")
    started_at_text = when_column("started_at", "Started")
    lease_until_text = when_column("lease_until", "Lease until")
    finished_at_text = when_column("finished_at", "Finished")
    duration_text = duration_column("duration", "Took")
