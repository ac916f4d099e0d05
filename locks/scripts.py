"""Loads the Lua scripts (common.lua is prepended to each) once per process."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import IntEnum
from functools import cache
from pathlib import Path
from typing import Any

from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

_DIR = Path(__file__).parent / "scripts"


class Acquire(IntEnum):
    """The first value of acquire.lua's reply (see its header)."""

    HELD = 0  # someone else holds it (and a blocking caller is queued)
    ACQUIRED = 1
    BATCHED = 2  # this request is in the holder's batch, or its reply waits: wait on
    GUARDED = 3  # a guard key exists: nothing was done
    TOO_LATE = -1  # the call reached Redis after its give-up time: nothing was done


class Cancel(IntEnum):
    """The first value of cancel.lua's reply."""

    LEFT = 0  # out of the queue, nothing was handed to us
    HANDED = 1  # the lock was handed to us just now: it is ours
    SERVED = 2  # a holder served this request just now: its reply


NOT_OURS = -1  # take.lua's reply when the lock's token is not the caller's
NAMES = ("acquire", "release", "extend", "cancel", "force_release", "check", "take", "reply")


@cache
def source(name: str) -> str:
    if name not in NAMES:
        raise KeyError(name)
    common = (_DIR / "common.lua").read_text()
    return common + "\n" + (_DIR / f"{name}.lua").read_text()


def as_text(args: Iterable[Any]) -> list[Any]:
    """The arguments with every int as text, for hiredis to pack.

    hiredis-py's pack_command formats an int with repr() and does not check the result. CPython
    runs pending signal handlers while it formats an int, so a Ctrl-C landing there makes repr()
    fail, and the process dies of a segmentation fault instead of raising KeyboardInterrupt. A
    waiter that dies like that leaves its queue entry behind. Formatted here, in Python, the
    interrupt is an ordinary exception.
    """
    return [str(arg) if isinstance(arg, int) else arg for arg in args]


class _Script(Script):
    """redis-py's Script (EVALSHA, loading the script on NOSCRIPT), with numkeys and every int
    argument sent as text (see `as_text`)."""

    def __call__(self, keys: Sequence[Any] | None = None, args: Iterable[Any] | None = None,
                 client: Any = None) -> Any:
        numkeys, keys_and_args = str(len(keys or ())), [*(keys or ()), *as_text(args or ())]
        if isinstance(client, Pipeline):  # as redis-py's: the pipeline loads it before it runs
            client.scripts.add(self)
        try:  # execute_command, not evalsha: its argument-deprecation wrapper cost ~3 us a call
            return client.execute_command("EVALSHA", self.sha, numkeys, *keys_and_args)
        except NoScriptError:
            self.sha = client.script_load(self.script)
            return client.execute_command("EVALSHA", self.sha, numkeys, *keys_and_args)


@cache
def script(name: str) -> Script:
    """A redis-py Script (EVALSHA, reloading on NOSCRIPT); pass `client=` on each call."""
    return _Script(None, source(name).encode())  # type: ignore[arg-type]  # the client comes with each call


def queue_script(pipe: Any, name: str, *, keys: list[str], args: list[Any]) -> None:
    """Queue script `name` on a pipeline as a bare EVALSHA; run the pipeline with `execute_pipeline`.
    (redis-py's Script on a pipeline asks SCRIPT EXISTS before every execute: a round trip more.)"""
    pipe.evalsha(script(name).sha, str(len(keys)), *keys, *as_text(args))


def execute_pipeline(client: Any, pipe: Any) -> list[Any]:
    """`pipe.execute()`; scripts the server did not know (restarted empty, SCRIPT FLUSH, a
    promoted replica) are loaded and those calls sent again, in their order. A WAIT after a
    missing script is sent again after it too: the first one ran before the script wrote anything,
    so its count says nothing of the write. Raises the first error, as execute does."""
    stack = [(args, options) for args, options in pipe.command_stack]
    results: list[Any] = pipe.execute(raise_on_error=False)
    missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
    if missing:
        by_sha = {script(name).sha: source(name) for name in NAMES}
        for sha in {stack[i][0][1] for i in missing}:
            client.script_load(by_sha[sha])
        again = [i for i, (args, _) in enumerate(stack)
                 if i in missing or (i > missing[0] and str(args[0]).upper() == "WAIT")]
        resend = client.pipeline(transaction=False)
        for i in again:
            args, options = stack[i]
            resend.execute_command(*args, **options)
        for i, result in zip(again, resend.execute(raise_on_error=False), strict=True):
            results[i] = result
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results
