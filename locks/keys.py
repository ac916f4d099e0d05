"""Key names. Every key of one lock carries the hash tag {name}: one Redis Cluster slot."""

from __future__ import annotations

from dataclasses import dataclass

from locks.conf import locks_settings

MAX_NAME_LENGTH = 200


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("a lock name must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"a lock name is at most {MAX_NAME_LENGTH} characters")
    if any(c in name for c in "{}*?[]\\") or any(c.isspace() for c in name):
        raise ValueError(f"lock name {name!r} may not contain braces, glob characters or spaces")
    return name


@dataclass(frozen=True)
class LockKeys:
    name: str
    prefix: str

    @classmethod
    def for_name(cls, name: str, prefix: str | None = None) -> LockKeys:
        return cls(validate_name(name), locks_settings.KEY_PREFIX if prefix is None else prefix)

    @property
    def lock(self) -> str:
        return f"{self.prefix}lock:{{{self.name}}}"

    @property
    def fence(self) -> str:
        return f"{self.lock}:fence"

    @property
    def queue(self) -> str:
        return f"{self.lock}:queue"

    @property
    def waiters(self) -> str:
        return f"{self.lock}:waiters"

    @property
    def signal_prefix(self) -> str:
        return f"{self.lock}:signal:"

    def signal(self, token: str) -> str:
        return self.signal_prefix + token

    @property
    def stats(self) -> str:
        return f"{self.prefix}lockstats:{{{self.name}}}"

    def all(self) -> list[str]:
        return [self.lock, self.fence, self.queue, self.waiters, self.stats]


def events_key(prefix: str | None = None) -> str:
    return f"{locks_settings.KEY_PREFIX if prefix is None else prefix}lockevents"


def name_from_key(key: str, kind: str = "lock") -> str:
    """`<prefix>lock:{product:42}` -> `product:42`."""
    start = key.index(f"{kind}:{{") + len(kind) + 2
    return key[start : key.rindex("}")]
