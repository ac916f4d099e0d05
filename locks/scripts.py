"""Loads the Lua scripts (common.lua is prepended to each) once per process."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from redis.commands.core import Script

_DIR = Path(__file__).parent / "scripts"
NAMES = ("acquire", "release", "extend", "cancel", "force_release", "check", "take")


@cache
def source(name: str) -> str:
    if name not in NAMES:
        raise KeyError(name)
    common = (_DIR / "common.lua").read_text()
    return common + "\n" + (_DIR / f"{name}.lua").read_text()


@cache
def script(name: str) -> Script:
    """A redis-py Script (EVALSHA, reloading on NOSCRIPT); pass `client=` on each call."""
    return Script(None, source(name).encode())
