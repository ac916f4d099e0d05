"""MySQL / MariaDB: DATABASES from DATABASE_URL (checked in environment.py: MySQL only, a database named)."""

from config.settings.environment import env, value

DATABASE_URL = value("DATABASE_URL")
_db = env.db_url_config(DATABASE_URL)
# Django's MySQL backend with a transaction opened in one round trip less (shop/plumbing/mysql/).
_db["ENGINE"] = "shop.plumbing.mysql"
# Another Django backend for the same server, e.g. loadtest.mysql8 (MariaDB dressed as
# MySQL 8.4: how load tests run the MySQL 8 paths on a machine without MySQL 8).
if _engine := value("DATABASE_ENGINE"):
    _db["ENGINE"] = _engine
# The Redis lock must cover COMMIT, so a request must never be one big transaction.
_db["ATOMIC_REQUESTS"] = False
# Persistent connections: a new MySQL connection per request cost a sold-out storm most of its
# time. Health checks drop a connection the server closed (wait_timeout, a restart) before use.
_db["CONN_MAX_AGE"] = value("CONN_MAX_AGE")
_db["CONN_HEALTH_CHECKS"] = True
_db.setdefault("OPTIONS", {}).update(
    {"charset": "utf8mb4", "isolation_level": "read committed", "connect_timeout": 5}
)
_db["TEST"] = {
    "NAME": value("TEST_DATABASE_NAME", default=f"test_{_db['NAME']}"),
    "CHARSET": "utf8mb4",
    "COLLATION": "utf8mb4_unicode_ci",
}
DATABASES = {"default": _db}
