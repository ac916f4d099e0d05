"""The house of shop/ keeps its floors (docs/design.md, "The house"): every module imports only
from the floors below it (lazy and TYPE_CHECKING imports too). The public verbs (services) stand
on the checkout's internals, which stand on the plumbing of MySQL and Redis, which stands on the
shop's values, models and rules; the doors (views, API, admin, commands, jobs) stand on top."""

from __future__ import annotations

from pathlib import Path

import shop
from tests.structure import floor_violations, imported_names, imports, modules

ROOT = Path(shop.__file__).parent

# Floor of each module (dotted names below `shop`); a package's modules default to the package's.
FLOORS = {
    0: ["conf", "errors", "models", "templatetags", "plumbing.clock", "plumbing.redis_keys", "plumbing.lock_names",
        "money"],
    1: ["validation", "reads", "edge", "ops", "api.tokens"],
    2: ["plumbing", "line"],
    3: ["checkout"],
    4: ["services"],
    5: ["admin", "web", "api", "management", "edge.middleware", "ops.checks", "ops.jobs", "apps", ""],
}
# The doors (dotted names below `shop`: a package, or one module of one).
DOORS = {"web", "api.views", "admin", "management", "ops.jobs"}


def test_every_module_imports_only_from_the_floors_below_it():
    assert floor_violations(ROOT, FLOORS) == []


def test_the_doors_reach_the_checkout_only_through_the_services():
    """Views, API, admin, commands and jobs call the verbs; the checkout's internals are not theirs."""
    found = modules(ROOT)
    reached = {m: sorted(t for t in imports(m, found[m], set(found)) if t.startswith("shop.checkout"))
               for m in found if any(f"{m}.".startswith(f"shop.{door}.") for door in DOORS)}
    assert {m: t for m, t in reached.items() if t} == {}


def test_the_app_never_imports_the_project():
    """config/ (settings, urls, the server) stands on the shop; the shop reads settings through
    django.conf only."""
    found = modules(ROOT)
    reached = {m: sorted(n for n in imported_names(m, path) if n.split(".")[0] == "config")
               for m, path in found.items()}
    assert {m: n for m, n in reached.items() if n} == {}
