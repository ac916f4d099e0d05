"""Admin views over live lock state (the django-rq idea: Redis state inside the admin).

Staff may look; only superusers and holders of `locks.force_release_lock` may release, and only
by POST with CSRF, after a confirmation page. Everything reads Redis through `locks.inspect`.
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.views.decorators.cache import never_cache

from locks import events, inspect
from locks.exceptions import HolderChanged, LockUnavailable
from locks.keys import validate_name
from locks.models import ForceRelease, LockDashboard
from locks.services import force_release_lock

PAGE_SIZE = 200
STATS_ROWS = 100
TOP_NAMES = 5  # busiest names shown per family (and looked up as held on the first page)


def can_release(user) -> bool:
    return user.is_active and (user.is_superuser or user.has_perm("locks.force_release_lock"))


def object_url(name: str) -> str | None:
    """product:42 -> its admin change page (coupon:7 likewise)."""
    kind, _, rest = name.partition(":")
    model = {"product": "shop_product", "coupon": "shop_coupon"}.get(kind)
    if model is None or not rest.isdigit():
        return None
    try:
        return reverse(f"admin:{model}_change", args=[int(rest)])
    except NoReverseMatch:
        return None


def _cursor(request: HttpRequest) -> int:
    raw = request.GET.get("cursor", "0")
    return int(raw) if raw.isdigit() and len(raw) < 20 else 0


def _prefix(request: HttpRequest) -> str:
    prefix = request.GET.get("prefix", "").strip()[:100]
    return prefix if all(c not in prefix for c in "{}*?[]\\ ") else ""


def snapshot(*, prefix: str, cursor: int) -> dict[str, Any]:
    """One page of held locks plus the stats by family, as plain data (the JSON endpoint and the page share it).

    Every refresh costs a few round trips and never a keyspace SCAN: the families (SMEMBERS),
    their counters and busiest names (one pipeline), the held index (one ZSCAN page of a small
    key) and the locks it names plus the busiest names (one pipeline).
    """
    stats = inspect.lock_stats(prefix=prefix, top=TOP_NAMES)
    hot = [name for s in stats for name, _ in s.top_names] if cursor == 0 else []
    next_cursor, held = inspect.held_index_page(prefix=prefix, cursor=cursor, count=PAGE_SIZE, also=hot)
    held.sort(key=lambda h: h.name)
    total = inspect.totals(stats)
    stats.sort(key=lambda s: s.counters.get("acquired", 0), reverse=True)
    now = time.time()
    combining = sorted((s for s in stats if s.counters.get("batches")), key=lambda s: -(s.last_batch_ms or 0))
    return {
        "at": now,
        "prefix": prefix,
        "cursor": cursor,
        "next_cursor": next_cursor,
        "held": [{**h.as_dict(), "url": object_url(h.name)} for h in held],
        "stats": [_stats_row(s, now) for s in stats[:STATS_ROWS]],
        "stats_families": len(stats),
        "combining": [_stats_row(s, now) for s in combining[:STATS_ROWS]],
        "totals": _with_ago(total.as_dict(), now),
        "backend": inspect.backend_info(),
    }


def _stats_row(stats: inspect.LockStats, now: float) -> dict[str, Any]:
    row = _with_ago(_with_ms(stats.as_dict()), now)
    row["top_names"] = [{**n, "url": object_url(n["name"])} for n in row["top_names"]]
    return row


def _with_ago(row: dict[str, Any], now: float) -> dict[str, Any]:
    """The last batch's age by the server's clock, so the page and the JSON agree."""
    at = row.get("last_batch_at")
    row["last_batch_ago"] = None if at is None else round(max(now - at, 0.0), 1)
    row["last_batch_text"] = inspect.ago(row["last_batch_ago"])
    row["batch_sizes_text"] = ", ".join(f"{k}: {n}" for k, n in row.get("batch_sizes", {}).items()) or "-"
    return row


def _with_ms(row: dict[str, Any]) -> dict[str, Any]:
    for key in ("wait_p50", "wait_p99", "hold_p50", "hold_p99"):
        row[f"{key}_ms"] = None if row[key] is None else round(row[key] * 1000, 1)
    return row


def _context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {**admin.site.each_context(request), "opts": LockDashboard._meta, "can_release": can_release(request.user),
            **extra}


@never_cache
def dashboard(request: HttpRequest) -> HttpResponse:
    prefix, cursor = _prefix(request), _cursor(request)
    try:
        data = snapshot(prefix=prefix, cursor=cursor)
        error = None
    except LockUnavailable as exc:
        data, error = None, f"The lock backend is unreachable: {exc}"
    return TemplateResponse(request, "admin/locks/dashboard.html", _context(
        request, title="Locks", data=data, error=error, prefix=prefix, backend=inspect.backend_info(),
        audits=ForceRelease.objects.select_related("actor")[:10],
    ))


@never_cache
def dashboard_data(request: HttpRequest) -> JsonResponse:
    try:
        return JsonResponse(snapshot(prefix=_prefix(request), cursor=_cursor(request)))
    except LockUnavailable as exc:
        return JsonResponse({"error": {"code": "lock_unavailable", "message": str(exc)}}, status=503)


@never_cache
def event_log(request: HttpRequest) -> HttpResponse:
    kind = request.GET.get("kind", "")
    kinds = (kind,) if kind in events.KINDS else events.KINDS
    try:
        rows, error = inspect.recent_events(limit=500, kinds=kinds), None
    except LockUnavailable as exc:
        rows, error = [], f"Redis is unreachable: {exc}"
    for row in rows:
        row["when"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["at"]))
        row["url"] = object_url(row["name"])
        row["extra"] = {k: v for k, v in row.items() if k not in {"at", "kind", "name", "when", "url"}}
    return TemplateResponse(request, "admin/locks/events.html", _context(
        request, title="Lock events", rows=rows, error=error, kinds=events.KINDS, kind=kind,
    ))


@never_cache
def force_release(request: HttpRequest, name: str) -> HttpResponse:
    if not can_release(request.user):
        raise PermissionDenied("You may look at locks, not release them.")
    try:
        validate_name(name)
        info = inspect.lock_info(name)
    except ValueError:
        messages.error(request, "That is not a lock name.")
        return redirect("admin:locks_lockdashboard_changelist")
    except LockUnavailable as exc:
        messages.error(request, f"Redis is unreachable: {exc}")
        return redirect("admin:locks_lockdashboard_changelist")
    if request.method == "POST":
        return _confirmed_release(request, name)
    return TemplateResponse(request, "admin/locks/confirm_release.html", _context(
        request, title=f"Force-release {name}?", name=name, info=info, url=object_url(name),
    ))


def _confirmed_release(request: HttpRequest, name: str) -> HttpResponse:
    """Release only the hold the confirmation page showed (its fence), never a newer one."""
    again = redirect("admin:locks_lockdashboard_release", name=name)
    try:
        fence = int(request.POST.get("fence", ""))
        if not 0 < fence < 2**63:
            raise ValueError(fence)
    except ValueError:
        messages.error(request, "Confirm the release on this page (it names the holder you release).")
        return again
    try:
        released = force_release_lock(name=name, expected_fence=fence, actor=request.user,
                                      actor_name=request.user.get_username())
    except HolderChanged as exc:
        messages.error(request, f"Not released: the holder changed since you looked ({exc.owner} holds it now, "
                                f"fence {exc.fence}). Check it again before releasing.")
        return again
    except LockUnavailable as exc:
        messages.error(request, f"Redis is unreachable: {exc}")
        return redirect("admin:locks_lockdashboard_changelist")
    if released is None:
        messages.warning(request, f"{name} was released before we got to it.")
    else:
        messages.success(request, f"Released {name} (held by {released.owner}, fence {released.fence}). "
                                  "The next waiter has it now; the old holder's writes will be refused.")
    return redirect("admin:locks_lockdashboard_changelist")
