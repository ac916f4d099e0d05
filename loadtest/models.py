from django.db import models


class DbLock(models.Model):
    """A lock row for the load test's "database lock table" strategy (unique-key insert = acquire).

    Not used by the shop itself; it exists so `manage.py loadtest` can measure the approach.
    Its rows live only as long as a run (table `loadtest_dblock`).
    """

    name = models.CharField(max_length=200, unique=True)
    owner = models.CharField(max_length=100)
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.owner})"
