"""`DATABASE_ENGINE=loadtest.mysql8`: Django's MySQL backend, dressed as MySQL 8.4 (see
the package's docstring). For load tests and app servers on MariaDB; never for production."""

from __future__ import annotations

from django.utils.functional import cached_property

from loadtest.mysql8 import dressed, refuse_what_mysql8_lacks
from shop.plumbing.mysql import base


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.execute_wrappers.insert(0, refuse_what_mysql8_lacks)

    @cached_property
    def mysql_server_data(self) -> dict:
        return dressed(super().mysql_server_data)
