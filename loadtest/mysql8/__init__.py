"""MySQL 8 on MariaDB: a connection that reports MySQL 8.4's features and refuses what MySQL 8 lacks.

No MySQL 8 server installs on our machines, yet MySQL 8 is a target (docs/design.md, "MySQL 8 and
MariaDB"). What differs and matters to the shop is small and known, so the MariaDB connection is
dressed as MySQL 8.4:

- Django sees server version "8.4.3" (not MariaDB): its MySQL features follow, among them no
  `INSERT ... RETURNING` (bulk inserts return no ids) and no native UUID type;
- a statement that MySQL 8 would refuse fails as it would there: `... RETURNING ...` (1064, a
  syntax error), the MariaDB-only variables `idle_transaction_timeout` & co. (1193, unknown
  system variable), `information_schema.INNODB_LOCK_WAITS` (removed in MySQL 8: 1109);
- so `shop.plumbing.stale_transactions` picks kill mode, as it does on MySQL 8.

Two ways in: `emulate(connection)` dresses a live connection for a while (the test suite's
`mysql8` fixture), and `DATABASE_ENGINE=loadtest.mysql8` makes it the project's database
engine (load tests and app servers started from them: `loadtest --fault all` in MySQL 8 mode).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import OperationalError, ProgrammingError, connections

VERSION = "8.4.3"
# Cached on a Django connection; computed again from the dressed server data.
_CACHED = ("mysql_server_data", "mysql_server_info", "mysql_version", "mysql_is_mariadb")

_REFUSED = (
    (re.compile(r"\bRETURNING\b", re.I), ProgrammingError, 1064,
     "You have an error in your SQL syntax (MySQL 8 has no INSERT ... RETURNING)"),
    (re.compile(r"\bidle_(?:readonly_|write_)?transaction_timeout\b", re.I), OperationalError, 1193,
     "Unknown system variable 'idle_transaction_timeout' (MariaDB only)"),
    (re.compile(r"\binformation_schema\s*\.\s*innodb_(?:lock_waits|locks)\b", re.I), ProgrammingError, 1109,
     "Unknown table in information_schema (removed in MySQL 8: use performance_schema.data_lock_waits)"),
)


# A quoted literal or identifier as MySQL reads it: a backslash escapes the next character and a
# doubled quote stands for one. The writer builds its INSERTs from escaped literals (a buyer's
# idempotency key among them), so the words of the data must not be taken for SQL.
_QUOTED = re.compile(r"""'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*"|`(?:[^`]|``)*`""", re.S)


def refuse_what_mysql8_lacks(execute, sql, params, many, context):
    """A Django execute wrapper: fail as MySQL 8 would on MariaDB-only SQL (outside literals)."""
    if isinstance(sql, str):
        statement = _QUOTED.sub("''", sql)
        for pattern, error, code, message in _REFUSED:
            if pattern.search(statement):
                raise error(code, message)
    return execute(sql, params, many, context)


def dressed(server_data: dict) -> dict:
    return {**server_data, "version": VERSION}


@contextmanager
def emulate(wrapper) -> Iterator[None]:
    """Dress a live Django MySQL connection as MySQL 8.4 until the block ends (processes forked
    inside the block inherit it). `wrapper`: a connection, or django.db's proxy of one."""
    wrapper = connections[wrapper.alias]  # the wrapper itself: its __dict__ holds the cached facts
    saved = {name: wrapper.__dict__[name] for name in _CACHED if name in wrapper.__dict__}
    features = wrapper.features
    real = wrapper.mysql_server_data
    for name in _CACHED:
        wrapper.__dict__.pop(name, None)
    wrapper.__dict__["mysql_server_data"] = dressed(real)
    wrapper.features = wrapper.features_class(wrapper)
    wrapper.execute_wrappers.insert(0, refuse_what_mysql8_lacks)
    try:
        yield
    finally:
        wrapper.execute_wrappers.remove(refuse_what_mysql8_lacks)
        for name in _CACHED:
            wrapper.__dict__.pop(name, None)
        wrapper.__dict__.update(saved)
        wrapper.features = features
