"""Admin views over live lock state (the django-rq idea: Redis state inside the admin).

Looking needs `locks.view_lockdashboard` (is_staff alone is not enough); releasing a
lock needs `locks.force_release_lock` and resetting the statistics `locks.reset_lock_stats`,
each besides the view permission, and only by POST with CSRF, after a confirmation page.
Everything reads Redis through `locks.inspect`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.module_loading import import_string
from django.views.decorators.cache import never_cache

from locks import events, formats, inspect
from locks.backends import HeldLock
from locks.conf import locks_settings
from locks.exceptions import HolderChanged, LockUnavailable
from locks.keys import family_of, validate_name
from locks.models import ForceRelease, LockDashboard
from locks.services import force_release_lock, reset_lock_stats

log = logging.getLogger("locks")

PAGE_SIZE = 200
STATS_ROWS = 100
TOP_NAMES = 5  # busiest names shown per family (and looked up as held on the first page)


# Details of the event log that are seconds (locks/lock.py records them): shown with their unit.
EVENT_DURATIONS = frozenset({"waited", "held", "held_for"})

VIEW = "locks.view_lockdashboard"
RELEASE = "locks.force_release_lock"
RESET = "locks.reset_lock_stats"


def allowed(user: Any, *perms: str) -> bool:  # user: AUTH_USER_MODEL's, or AnonymousUser
    """Active staff holding every permission (superusers hold them all)."""
    return user.is_active and user.is_staff and all(user.has_perm(p) for p in (VIEW, *perms))


def can_release(user: Any) -> bool:
    return allowed(user, RELEASE)


def require(request: HttpRequest, *perms: str) -> None:
    """Every lock page checks here, not only in the admin's wiring: a view reached another way
    (a test, a project's own URL) still refuses a user without the view permission."""
    if not allowed(request.user, *perms):
        raise PermissionDenied("You may not see the lock dashboard." if not perms
                               else "You may look at locks, not do this.")


# Lock name kinds that name a row of the shop, linked from the dashboard to its admin page.
TARGETS = {"product": ("shop", "Product"), "coupon": ("shop", "Coupon")}


def _target(name: str) -> tuple[str, int] | None:
    kind, _, rest = name.partition(":")
    return (kind, int(rest)) if kind in TARGETS and rest.isdigit() and len(rest) < 19 else None


def link_targets(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """name -> {"url": its admin change page or None, "gone": True if its row was deleted}.

    Load tests delete their products when they end, while their stats stay for the metrics TTL:
    such names are marked gone and not linked (a link would lead to "doesn't exist"). One query
    per kind of name, whatever the number of names.
    """
    wanted: dict[str, set[int]] = defaultdict(set)
    names = list(dict.fromkeys(names))
    for name in names:
        if (target := _target(name)) is not None:
            wanted[target[0]].add(target[1])
    existing: dict[str, set[int]] = {}
    for kind, ids in wanted.items():
        try:
            model = apps.get_model(*TARGETS[kind])
        except LookupError:  # the shop is not installed beside the locks app
            continue
        existing[kind] = set(model._default_manager.filter(pk__in=ids).values_list("pk", flat=True))
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        target = _target(name)
        if target is None or target[0] not in existing:
            out[name] = {"url": None, "gone": False}
        elif target[1] in existing[target[0]]:
            out[name] = {"url": object_url(name), "gone": False}
        else:
            out[name] = {"url": None, "gone": True}
    return out


def object_url(name: str) -> str | None:
    """product:42 -> its admin change page (coupon:7 likewise); existence is not checked here."""
    target = _target(name)
    if target is None:
        return None
    try:
        return reverse(f"admin:{TARGETS[target[0]][0]}_{TARGETS[target[0]][1].lower()}_change", args=[target[1]])
    except NoReverseMatch:
        return None


def _cursor(request: HttpRequest) -> int:
    raw = request.GET.get("cursor", "0")
    return int(raw) if raw.isdigit() and len(raw) < 20 else 0


def _prefix(request: HttpRequest) -> str:
    prefix = request.GET.get("prefix", "").strip()[:100]
    return prefix if all(c not in prefix for c in "{}*?[]\\ ") else ""


def extra_panels() -> list[dict[str, Any]]:
    """The project's own panels (LOCKS["DASHBOARD_PANELS"]); one that fails says so in its note."""
    panels = []
    for path in locks_settings.DASHBOARD_PANELS:
        try:
            panels.append(import_string(path)())
        except Exception as exc:  # a panel of the project must never break the lock dashboard
            log.warning("lock dashboard: panel %s failed: %s", path, exc)
            panels.append({"id": path.rsplit(".", 1)[-1], "title": path, "note": f"unavailable: {exc}",
                           "headers": [], "rows": []})
    return panels


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
    shown = stats[:STATS_ROWS]
    targets = link_targets([h.name for h in held] + [n for s in shown for n, _ in s.top_names])
    hold_p99 = {s.name: s.quantiles()["hold_p99"] for s in stats}
    return {
        "at": now,
        "at_text": formats.when(now),
        "panels": extra_panels(),
        "prefix": prefix,
        "cursor": cursor,
        "next_cursor": next_cursor,
        "held": [_held_row(h, hold_p99.get(family_of(h.name)), targets[h.name]) for h in held],
        "stats": [_stats_row(s, now, targets) for s in shown],
        "stats_families": len(stats),
        "combining": [_stats_row(s, now, targets) for s in combining[:STATS_ROWS]],
        "totals": _with_ago(total.as_dict(), now),
        "backend": inspect.backend_info(),
    }


def _held_row(held: HeldLock, hold_p99: float | None, target: dict[str, Any]) -> dict[str, Any]:
    """A held lock with its durations written out, and whether it looks stuck: held longer than
    its family's holds usually take (`inspect.stuck_after`; the legend says what to do then)."""
    after = inspect.stuck_after(hold_p99)
    p99 = "none finished yet" if hold_p99 is None else formats.duration(hold_p99)
    return {**held.as_dict(), **target, "held_for_text": formats.duration(held.held_for),
            "ttl_left_text": formats.duration(held.ttl_left), "stuck": held.held_for > after, "stuck_after": after,
            "stuck_title": f"Held longer than {formats.duration(after)}: {inspect.STUCK_FACTOR} times its family's "
                           f"hold p99 ({p99}), at least {formats.duration(inspect.STUCK_FLOOR)}. "
                           f"Force-release only a hung holder: see the legend."}


def _stats_row(stats: inspect.LockStats, now: float, targets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    row = _with_ago(_with_text(stats.as_dict()), now)
    row["top_names"] = [{**n, **targets.get(n["name"], {"url": None, "gone": False})} for n in row["top_names"]]
    return row


def _with_ago(row: dict[str, Any], now: float) -> dict[str, Any]:
    """The last batch's age by the server's clock, so the page and the JSON agree."""
    at = row.get("last_batch_at")
    row["last_batch_ago"] = None if at is None else round(max(now - at, 0.0), 1)
    row["last_batch_text"] = inspect.ago(row["last_batch_ago"])
    row["last_batch_at_text"] = formats.when(at)
    row["batch_sizes_text"] = ", ".join(f"{k}: {n}" for k, n in row.get("batch_sizes", {}).items()) or "-"
    return row


def _with_text(row: dict[str, Any]) -> dict[str, Any]:
    """The quantiles written out with their unit ("0.67 ms"), as the page and its refresh show them."""
    for key in ("wait_p50", "wait_p99", "hold_p50", "hold_p99"):
        row[f"{key}_text"] = formats.duration(row[key])
    return row


def _context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    user = request.user
    return {**admin.site.each_context(request), "opts": LockDashboard._meta, "can_release": can_release(user),
            "can_reset": allowed(user, RESET), "can_view_audit": user.has_perm("locks.view_forcerelease"), **extra}


@never_cache
def dashboard(request: HttpRequest) -> HttpResponse:
    require(request)
    prefix, cursor = _prefix(request), _cursor(request)
    try:
        data = snapshot(prefix=prefix, cursor=cursor)
        error = None
    except LockUnavailable as exc:
        data, error = None, f"The lock backend is unreachable: {exc}"
    may_audit = request.user.has_perm("locks.view_forcerelease")
    audits = ForceRelease.objects.select_related("actor")[:10] if may_audit else []
    return TemplateResponse(request, "admin/locks/dashboard.html", _context(
        request, title="Locks", data=data, error=error, prefix=prefix, backend=inspect.backend_info(), audits=audits,
    ))


@never_cache
def dashboard_data(request: HttpRequest) -> JsonResponse:
    require(request)
    try:
        return JsonResponse(snapshot(prefix=_prefix(request), cursor=_cursor(request)))
    except LockUnavailable as exc:
        return JsonResponse({"error": {"code": "lock_unavailable", "message": str(exc)}}, status=503)


@never_cache
def event_log(request: HttpRequest) -> HttpResponse:
    require(request)
    kind = request.GET.get("kind", "")
    kinds = (kind,) if kind in events.KINDS else events.KINDS
    try:
        rows, error = inspect.recent_events(limit=500, kinds=kinds), None
    except LockUnavailable as exc:
        rows, error = [], f"Redis is unreachable: {exc}"
    targets = link_targets(row["name"] for row in rows)
    for row in rows:
        row["when"] = formats.when(row["at"])
        row.update(targets[row["name"]])
        row["extra"] = {k: formats.duration(v) if k in EVENT_DURATIONS and isinstance(v, int | float) else v
                        for k, v in row.items() if k not in {"at", "kind", "name", "when", "url", "gone"}}
    return TemplateResponse(request, "admin/locks/events.html", _context(
        request, title="Lock events", rows=rows, error=error, kinds=events.KINDS, kind=kind,
    ))


@never_cache
def force_release(request: HttpRequest, name: str) -> HttpResponse:
    require(request, RELEASE)
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


@never_cache
def reset_stats(request: HttpRequest) -> HttpResponse:
    """GET: what a reset forgets, and a confirmation; POST with confirm=yes: reset, audited in the
    event log (who, how many families). The CLI twin: `manage.py locks reset-stats`."""
    require(request, RESET)
    try:
        if request.method == "POST":
            if request.POST.get("confirm") != "yes":
                messages.error(request, "Confirm the reset on this page.")
                return redirect("admin:locks_lockdashboard_reset_stats")
            families = reset_lock_stats(actor_name=request.user.get_username())
            messages.success(request, f"Reset the statistics of {len(families)} lock famil"
                                      f"{'y' if len(families) == 1 else 'ies'}; they count from zero now.")
            return redirect("admin:locks_lockdashboard_changelist")
        families = inspect.families()
    except LockUnavailable as exc:
        messages.error(request, f"Redis is unreachable: {exc}")
        return redirect("admin:locks_lockdashboard_changelist")
    return TemplateResponse(request, "admin/locks/confirm_reset.html", _context(
        request, title="Reset lock statistics?", families=families,
    ))
