"""Bounded lease renewal (a watchdog) for holds taken with `renew=True`.

One daemon thread per process renews every due hold by token-checked EXTEND. It stops renewing
a hold at release, when the hold reaches its `max_hold`, when the process exits (daemon thread)
and, after `fork()`, in the child (the child gets a fresh, empty renewer). When a renewal finds
the lock gone, the hold is marked lost so the holder can tell before it commits.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from locks.exceptions import LockUnavailable

if TYPE_CHECKING:
    from locks.hold import Hold

log = logging.getLogger("locks")

# Seconds between looks while holds keep coming and none is due sooner. Renewals are due a third
# of a lease after acquiring (>= 0.16 s with the defaults), so a tick of 50 ms is never late.
IDLE_TICK = 0.05


class Renewer:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Hold]] = []
        self._seq = 0
        self._thread: threading.Thread | None = None
        self._wakes_at = 0.0  # when the sleeping thread wakes by itself (0: it is awake)
        self._last_add = 0.0

    def add(self, hold: Hold) -> None:
        due = self._next_time(hold)
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, hold))
            self._last_add = time.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="locks-renewer", daemon=True)
                self._thread.start()
            elif due < self._wakes_at:
                # Wake the thread only if it would sleep past this hold's due time. While holds
                # keep coming it ticks every IDLE_TICK anyway, so a stream of short holds (every
                # contended acquisition: its hand-off lease is to be confirmed) never wakes it
                # from inside a critical section: that cost a GIL hand-off per acquisition.
                self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    @staticmethod
    def _next_time(hold: Hold) -> float:
        # A fraction of the lease still left: a short hand-off lease is confirmed early.
        return time.monotonic() + hold.remaining() * hold.renew_fraction

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    self._heap = [e for e in self._heap if e[2].renewing]
                    heapq.heapify(self._heap)
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        _, _, hold = heapq.heappop(self._heap)
                        break
                    now = time.monotonic()
                    if self._heap:
                        timeout = self._heap[0][0] - now
                    else:  # tick while holds keep coming; after a quiet second, sleep long
                        timeout = IDLE_TICK if now - self._last_add < 1.0 else 30.0
                    self._wakes_at = now + timeout
                    self._cond.wait(timeout)
                    self._wakes_at = 0.0  # awake: add() must not rely on a wake-up
            self._renew(hold)
            if hold.renewing:
                with self._cond:
                    self._seq += 1
                    heapq.heappush(self._heap, (self._next_time(hold), self._seq, hold))

    @staticmethod
    def _renew(hold: Hold) -> None:
        if hold.pid != os.getpid():
            hold.renewing = False
            return
        if time.monotonic() - hold.acquired_at >= hold.max_hold:
            # Bounded: a hung holder must not keep its lock forever. It lapses at its TTL.
            hold.renewing = False
            log.warning("lock %s: renewal stopped after max_hold=%ss", hold.name, hold.max_hold)
            return
        try:
            hold._renew_once()
        except (RedisError, LockUnavailable):
            # Try again at the next tick; if the lease runs out first the hold is lost.
            log.warning("lock %s: renewal failed, will retry", hold.name, exc_info=True)


_renewer = Renewer()


def renewer() -> Renewer:
    return _renewer


def _after_fork_in_child() -> None:
    global _renewer
    _renewer = Renewer()


os.register_at_fork(after_in_child=_after_fork_in_child)
