"""Durable transactions that say what happened when MySQL goes away.

A lost connection surfaces as MySQLdb errors 2006 (server has gone away), 2013 (lost during a
query), 2055 (lost during a read) or, once Django knows, as an InterfaceError; a connection the
server refuses (too many connections: 1040, 1203, 1226) is treated the same. Mid-order that
must be a typed, retryable `DatabaseUnavailable`, never a 500, and the caller must learn whether
anything could have been written: before COMMIT nothing was ("not_written"); during COMMIT the
server may have committed ("unknown"), which an Idempotency-Key resolves on retry.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connection, transaction

from shop import errors
from shop.plumbing import retries, stale_transactions

log = logging.getLogger("shop")

T = TypeVar("T")

# CR_SERVER_GONE_ERROR, CR_SERVER_LOST, CR_SERVER_LOST_EXTENDED; CR_CONNECTION_ERROR and
# CR_CONN_HOST_ERROR when the reconnect of a later statement fails too.
LOST_CONNECTION = {2006, 2013, 2055, 2002, 2003}
# The server refuses a new connection: ER_CON_COUNT_ERROR ("Too many connections"),
# ER_TOO_MANY_USER_CONNECTIONS (max_user_connections), ER_USER_LIMIT_REACHED (the account's own
# MAX_USER_CONNECTIONS). A crowd's first seconds can use them all up.
REFUSED_CONNECTION = {1040, 1203, 1226}


def lost_connection(exc: BaseException) -> bool:
    """The connection was lost, or the server would not give one: either way the database is
    unavailable (`DatabaseUnavailable`, 503), not a bug."""
    if isinstance(exc, InterfaceError):
        return True
    return (isinstance(exc, OperationalError) and bool(exc.args)
            and exc.args[0] in LOST_CONNECTION | REFUSED_CONNECTION)


def drop_connection() -> None:
    """Forget the broken connection: the next query (of this request or the next) reconnects."""
    with contextlib.suppress(Exception):
        connection.close()


@contextmanager
def durable_transaction() -> Iterator[None]:
    """`transaction.atomic(durable=True)` that turns a lost connection into DatabaseUnavailable."""
    committing = False
    try:
        # Bounded (a paused holder's transaction must end, I7), and watched after a row wait ran out.
        with stale_transactions.service_transaction(), transaction.atomic(durable=True):
            yield
            committing = True  # the block is done: what fails from here on is the COMMIT
    except (OperationalError, InterfaceError) as exc:
        if not lost_connection(exc):
            raise
        drop_connection()
        raise errors.DatabaseUnavailable(details={"outcome": "unknown" if committing else "not_written"}) from exc


@contextmanager
def connection_errors() -> Iterator[None]:
    """Around a whole service call: a connection lost outside the transaction (a read before the
    lock, a replay lookup) wrote nothing."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        if not lost_connection(exc):
            raise
        drop_connection()
        raise errors.DatabaseUnavailable(details={"outcome": "not_written"}) from exc


def with_retries(attempt: Callable[[], T], *, what: str) -> T:
    """Run `attempt` again on deadlock, lock-wait timeout, stale fence or lost lock; bounded
    (`retries.TRANSIENT`), then `conflict`."""
    return retries.TRANSIENT(attempt, what=what)
