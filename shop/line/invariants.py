"""The line's invariants (docs/design.md, "The line": L1-L4), checked from what Redis holds of a
drop's line and the orders MySQL holds, after a test or a load run (like shop/ops/invariants.py)."""

from __future__ import annotations

from shop import line
from shop.models import Order, Product

LET_THROUGH = {"a", "s", "d", "l"}


def line_violations(product: Product) -> list[str]:
    """What breaks L1-L3 in the line of `product`'s drop ([] if nothing). L4 (a Redis restart
    gives nobody a better place) is a property of the places themselves: the tests that restart
    Redis check it."""
    config = line.config_of(product)
    if config is None:
        return []
    client = line.client()
    meta, places, waiting, _, states = line.keys(config.product_id, config.drop)[:5]
    placed = dict((user.decode(), score) for user, score in client.zrange(places, 0, -1, withscores=True))
    queued = dict((user.decode(), score) for user, score in client.zrange(waiting, 0, -1, withscores=True))
    state = {k.decode(): v.decode() for k, v in client.hgetall(states).items()}
    cut = client.hget(meta, "cut")
    problems = []
    # L3: one place per account, no two places alike (ties would leave the order to chance).
    if len(set(placed.values())) != len(placed):
        problems.append("L3: two accounts hold the same place")
    through = {user: placed[user] for user, code in state.items() if code in LET_THROUGH and user in placed}
    # L1: turns follow places. Nobody bought without a turn; nobody waits with an earlier place
    # than someone let through (but a place taken back from a ticket after Redis lost the line).
    buyers = set(Order.objects.filter(lines__product_id=product.pk, created_at__gte=product.opens_at)
                 .values_list("user_id", flat=True))
    if strays := sorted(uid for uid in buyers if str(uid) not in through):
        problems.append(f"L1: accounts bought without a turn in the line: {strays[:10]}")
    if through:
        last = max(through.values())
        before = [user for user, score in queued.items() if score < last and not state.get(f"r:{user}")
                  and (cut is None or score < float(cut))]
        if before:
            problems.append(f"L1: accounts wait with an earlier place than one let through: {sorted(before)[:10]}")
    # L2: nobody past the cut was let through while it stands.
    if cut is not None and (past := sorted(u for u, score in through.items() if score >= float(cut))):
        problems.append(f"L2: accounts let through past the sold-out cut: {past[:10]}")
    return problems
