"""Where one order's time goes: client CPU, MySQL statements and Redis round trips per order.

One process places orders one after another (no contention: every order is a batch of one), so
what is measured is the path's own cost, not waiting. The same orders through the guarded ORM
loop (`strategies.GuardedUpdate`) give the yardstick the checkout must beat.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis.connection
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from loadtest import strategies, workload


@dataclass
class PathCost:
    name: str
    orders: int
    cpu_ms: float  # client CPU per order (this process: Python, drivers, serialisation)
    wall_ms: float  # per order, MySQL and Redis round trips included
    sql: float  # statements per order
    redis: float  # round trips per order (a pipeline is one)
    profile: str = ""


@contextmanager
def redis_round_trips() -> Iterator[list[int]]:
    """Count what redis-py sends: every send_packed_command is one round trip."""
    count = [0]
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):
        count[0] += 1
        return original(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = counting
    try:
        yield count
    finally:
        redis.connection.AbstractConnection.send_packed_command = original


def measure(name: str, place: Callable[[int], object], orders: int, *, profile: bool, top: int) -> PathCost:
    """Place `orders` orders with place(i); warm up first (connections, caches)."""
    for i in range(min(20, orders)):
        place(i)
    profiler = cProfile.Profile(time.process_time) if profile else None
    with CaptureQueriesContext(connection) as queries, redis_round_trips() as trips:
        cpu, wall = time.process_time(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        for i in range(orders):
            place(i)
        if profiler is not None:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    text = ""
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
        text = out.getvalue()
    return PathCost(name=name, orders=orders, cpu_ms=cpu * 1000 / orders, wall_ms=wall * 1000 / orders,
                    sql=len(queries.captured_queries) / orders, redis=trips[0] / orders, profile=text)


def compare(*, orders: int, products: int, profile: bool = False, top: int = 25) -> list[PathCost]:
    """The checkout (`ours`) and the guarded ORM loop on the same fresh workload."""
    from shop.services import place_order

    work = workload.create(workload.new_run_id(), products=products, stock=10 * orders + 100, users=50)
    try:
        users = get_user_model().objects.in_bulk(work.user_ids)
        user_ids = work.user_ids

        def ours(i: int) -> object:
            return place_order(user=users[user_ids[i % len(user_ids)]],
                               lines=[(work.product_ids[i % products], 1)])

        guarded = strategies.GuardedUpdate(strategies.Options(run_id=work.run_id, prices=work.prices))

        def loop(i: int) -> object:
            return guarded.place(user_ids[i % len(user_ids)], [(work.product_ids[i % products], 1)])

        return [measure("ours", ours, orders, profile=profile, top=top),
                measure("guarded", loop, orders, profile=profile, top=top)]
    finally:
        workload.cleanup(work)
