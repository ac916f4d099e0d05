"""Django's MySQL backend, with a transaction framed in two round trips instead of three.

Django opens an atomic block's transaction by turning autocommit off (SET autocommit=0) and,
after its COMMIT or ROLLBACK, turns it on again (SET autocommit=1). Here the block opens with
START TRANSACTION, which leaves the session in autocommit: the COMMIT or ROLLBACK ends the
explicit transaction, and turning autocommit on again is nothing to send (MySQLdb sends it only
when the last reply's status says autocommit is off). Every other statement, and a caller's own
`transaction.set_autocommit(False)`, behaves as in Django's backend. A checkout batch's
transaction was ten statements, two of them these SETs (issue 39's profile).
"""

from __future__ import annotations

from django.db.backends.mysql import base
from django.db.backends.utils import debug_transaction


class DatabaseWrapper(base.DatabaseWrapper):
    def _start_transaction_under_autocommit(self) -> None:
        """Django calls this, instead of turning autocommit off, when an atomic block opens."""
        with debug_transaction(self, "START TRANSACTION"), self.wrap_database_errors, \
                self.connection.cursor() as cursor:
            cursor.execute("START TRANSACTION")
