"""Key names. Every key of one lock carries the hash tag {name}: one Redis Cluster slot.

Statistics are kept per lock *family* (`product:*` for `product:42`), in keys that no lock
script touches: the per-process recorder (locks/stats.py) writes them, so the scripts stay
within one lock's slot on Redis Cluster.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from locks.conf import locks_settings

MAX_NAME_LENGTH = 200


def validate_name(name: str) -> str:
    if type(name) is str and name in _VALID_NAMES:  # a lock per order: its name was checked before
        return name
    _check_name(name)
    if len(_VALID_NAMES) < 10_000:
        _VALID_NAMES.add(name)
    return name


_VALID_NAMES: set[str] = set()


def validate_needs(names: Iterable[str]) -> None:
    """Names of locks a combining request needs: travel comma-separated, so no comma in one."""
    for name in names:
        if "," in validate_name(name):
            raise ValueError(f"a needed lock's name may not contain a comma: {name!r}")


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError("a lock name must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"a lock name is at most {MAX_NAME_LENGTH} characters")
    if any(c in name for c in "{}*?[]\\") or any(c.isspace() for c in name):
        raise ValueError(f"lock name {name!r} may not contain braces, glob characters or spaces")


@dataclass(frozen=True)
class LockKeys:
    name: str
    prefix: str

    @classmethod
    def for_name(cls, name: str, prefix: str | None = None) -> LockKeys:
        """The keys of lock `name`; kept per name and prefix, as a lock per order asks for the
        same few names again and again (and each key is a string built once)."""
        prefix = locks_settings.KEY_PREFIX if prefix is None else prefix
        return _kept_keys(name, prefix) if type(name) is str else cls(validate_name(name), prefix)

    @functools.cached_property
    def lock(self) -> str:
        return f"{self.prefix}lock:{{{self.name}}}"

    @functools.cached_property
    def fence(self) -> str:
        return f"{self.lock}:fence"

    @functools.cached_property
    def queue(self) -> str:
        return f"{self.lock}:queue"

    @functools.cached_property
    def waiters(self) -> str:
        return f"{self.lock}:waiters"

    @functools.cached_property
    def wake(self) -> str:
        return f"{self.lock}:wake"

    @functools.cached_property
    def taken(self) -> str:
        return f"{self.lock}:taken"

    @functools.cached_property
    def signal_prefix(self) -> str:
        return f"{self.lock}:signal:"

    def signal(self, token: str) -> str:
        return self.signal_prefix + token

    def all(self) -> list[str]:
        return [self.lock, self.fence, self.queue, self.waiters, self.wake, self.taken]


@functools.lru_cache(maxsize=10_000)
def _kept_keys(name: str, prefix: str) -> LockKeys:
    """LockKeys.for_name's table: the least used go first, so names used once (idempotency keys)
    never crowd out the hot ones; a refused name raises and is not kept."""
    return LockKeys(validate_name(name), prefix)


@functools.lru_cache(maxsize=4096)
def family_of(name: str) -> str:
    """The default family of a lock name: every all-digit `:`-segment becomes `*`.

    `product:42` -> `product:*`, `coupon:3:user:9` -> `coupon:*:user:*`. Names that carry other
    unbounded parts (hashes, uuids) should pass `Lock(family=...)`, or every name is a family.
    """
    if not any(c.isdigit() for c in name):
        return name
    return ":".join("*" if part.isdigit() else part for part in name.split(":"))


def _p(prefix: str | None) -> str:
    return locks_settings.KEY_PREFIX if prefix is None else prefix


def stats_key(family: str, prefix: str | None = None) -> str:
    """Hash of counters and log2 histogram buckets of one family."""
    return f"{_p(prefix)}lockstats:{{{family}}}"


def hot_key(family: str, prefix: str | None = None) -> str:
    """Sorted set: lock name -> acquisitions, trimmed to the top LOCKS["STATS_TOP_N"] names."""
    return f"{_p(prefix)}lockhot:{{{family}}}"


def families_key(prefix: str | None = None) -> str:
    """Set of the families that have stats."""
    return f"{_p(prefix)}lockfamilies"


def held_key(prefix: str | None = None) -> str:
    """Sorted set of holds published by the recorders: "<name> <token>" -> lease end (unix ms)."""
    return f"{_p(prefix)}lockheld"


def held_member(name: str, token: str) -> str:
    """A member of the held index. Names never contain spaces; the token keeps holders apart."""
    return f"{name} {token[:16]}"


def name_from_member(member: str) -> str:
    return member.split(" ", 1)[0]


def events_key(prefix: str | None = None) -> str:
    return f"{locks_settings.KEY_PREFIX if prefix is None else prefix}lockevents"


def name_from_key(key: str, kind: str = "lock") -> str:
    """`<prefix>lock:{product:42}` -> `product:42`."""
    start = key.index(f"{kind}:{{") + len(kind) + 2
    return key[start : key.rindex("}")]
