"""Create the configured MySQL database if it does not exist (utf8mb4)."""

import MySQLdb
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Create the database named in DATABASE_URL if it is missing."

    def handle(self, *args, **options) -> None:
        db = settings.DATABASES["default"]
        try:
            conn = MySQLdb.connect(
                host=db.get("HOST") or "127.0.0.1",
                port=int(db.get("PORT") or 3306),
                user=db.get("USER") or "root",
                passwd=db.get("PASSWORD") or "",
                connect_timeout=5,
            )
        except MySQLdb.OperationalError as exc:
            raise CommandError(f"cannot reach MySQL at {db.get('HOST')}:{db.get('PORT')}: {exc}") from exc
        name = db["NAME"].replace("`", "")
        with conn.cursor() as cur:
            cur.execute(
                f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            )
        conn.close()
        if options["verbosity"] > 1:
            self.stdout.write(f"database {name} ready")
