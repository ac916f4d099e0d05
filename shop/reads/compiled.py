"""ORM reads that every process repeats every second with only the time changing, compiled once.

The checkout keeps per-process copies of which products have a drop line and which have an
account-age rule, read again every second (shop/line/, shop/edge/account_age.py). Building and
compiling those querysets (Q trees, the window's conditions) was 0.6-0.7 ms of CPU a read, for
an empty result, against 0.1 ms for sending the SQL; the load test's 16 processes paid it 32
times a second (issue 39's profile: 4-5% of the checkout's samples). So the queryset is built and
compiled once, with a stand-in time, and each read sends that same SQL with the time of the read
in the stand-in's places; Django's own converters turn the rows into values (aware datetimes,
durations), as evaluating the queryset would. The ORM stays the one place where the query is
written.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.models import QuerySet

# Stands for "now" while compiling: a time no real read uses.
_STAND_IN = dt.datetime(1970, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)


class TimedRead:
    """`build(now)` is a values_list queryset; `rows(now=...)` is `list(build(now))`."""

    def __init__(self, build: Callable[[dt.datetime], QuerySet]) -> None:
        self.build = build
        self._compiled: tuple[str, str, list[Any], set[int], Any] | None = None
        self._guard = threading.Lock()

    def rows(self, *, now: dt.datetime) -> list[tuple]:
        compiled = self._compiled
        if compiled is None:
            with self._guard:
                compiled = self._compiled = self._compiled or self._compile(self.build(_STAND_IN))
        alias, sql, params, places, compiler = compiled
        if not places:  # the backend kept the time out of the parameters: no shortcut
            return list(self.build(now))
        connection = connections[alias]
        at = connection.ops.adapt_datetimefield_value(now)
        with connection.cursor() as cursor:
            cursor.execute(sql, [at if i in places else p for i, p in enumerate(params)])
            fetched = cursor.fetchall()
        return [tuple(row) for row in compiler.results_iter(results=[fetched])]

    @staticmethod
    def _compile(queryset: QuerySet) -> tuple[str, str, list[Any], set[int], Any]:
        alias = queryset.db
        compiler = queryset.query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        stand_in = connections[alias].ops.adapt_datetimefield_value(_STAND_IN)
        return alias, sql, list(params), {i for i, p in enumerate(params) if p == stand_in}, compiler
