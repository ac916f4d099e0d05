"""Tables of the locks app. Lock state itself lives in Redis; these exist for the admin."""

from django.conf import settings
from django.db import models


class LockDashboard(models.Model):
    """No table: an entry on the admin index for the live lock dashboard, and its permissions."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("force_release_lock", "Can force-release locks")]
        verbose_name = "lock dashboard"
        verbose_name_plural = "lock dashboard"

    def __str__(self) -> str:
        return "lock dashboard"


class ForceRelease(models.Model):
    """Audit trail: who force-released which lock, whose hold it ended, and its fence."""

    lock_name = models.CharField(max_length=200, db_index=True)
    fence = models.BigIntegerField()
    owner = models.CharField(max_length=200, help_text="host:pid of the holder it ended")
    held_for = models.FloatField(help_text="seconds the lock had been held")
    waiters = models.PositiveIntegerField(default=0)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    actor_name = models.CharField(max_length=150)
    released_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-released_at"]
        verbose_name = "force release"

    def __str__(self) -> str:
        return f"{self.lock_name} (fence {self.fence}) by {self.actor_name}"
