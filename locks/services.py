"""Operator actions on locks that leave an audit trail: one path for the admin and the CLI."""

from __future__ import annotations

import getpass
import socket
from typing import Any

from locks import events, inspect, stats
from locks.connection import default_client
from locks.inspect import HeldLock
from locks.models import ForceRelease


def cli_actor_name() -> str:
    """Who runs a management command: the OS user at the host (there is no Django user)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers with an arbitrary uid)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def force_release_lock(*, name: str, expected_fence: int | None, actor_name: str,
                       actor: Any = None) -> HeldLock | None:  # actor: a user (AUTH_USER_MODEL's)
    """Force-release `name` and write the audit row; None if nobody held it.

    `expected_fence` is the holder the operator saw and confirmed: if another holds the lock
    now, `locks.HolderChanged` is raised and nothing is released or written.
    """
    waiters = info.waiters if (info := inspect.lock_info(name)) is not None else 0
    released = inspect.force_release(name, actor=actor_name, expected_fence=expected_fence)
    if released is not None:
        ForceRelease.objects.create(
            lock_name=name, fence=released.fence, owner=released.owner, held_for=round(released.held_for, 3),
            waiters=waiters, actor=actor, actor_name=actor_name,
        )
    return released


def reset_lock_stats(*, actor_name: str) -> list[str]:
    """Forget every family's statistics (`locks.stats.reset`) and say who did, in the event log
    (kind `stats_reset`), so a dashboard that suddenly shows zeros is explained. Returns the
    families reset."""
    families = stats.reset()
    events.record_event(default_client(), events.STATS_RESET, "*", actor=actor_name, families=len(families))
    return families
