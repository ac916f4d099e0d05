"""Tables of the locks app. Lock state itself lives in Redis; these exist for the admin."""

from django.conf import settings
from django.db import models


class LockDashboard(models.Model):
    """No table: an entry on the admin index for the live lock dashboard, and its permissions:
    `view_lockdashboard` to look (the dashboard, its JSON, the event log), `force_release_lock`
    and `reset_lock_stats` for the two operator actions (each needs the view permission too)."""

    class Meta:
        managed = False
        default_permissions = ("view",)
        permissions = [("force_release_lock", "Can force-release locks"),
                       ("reset_lock_stats", "Can reset lock statistics")]
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


class JobRun(models.Model):
    """One tick of one scheduled job (locks/jobs.py). The unique (job, tick) key is what makes a
    tick run once in the whole cluster: the Redis lock only keeps runners from racing for it."""

    RUNNING = "running"
    OK = "ok"
    ERROR = "error"
    TAKEN_OVER = "taken_over"
    OUTCOMES = [
        (RUNNING, "running"),
        (OK, "ok"),
        (ERROR, "error"),
        (TAKEN_OVER, "taken over (running again)"),
    ]
    ACTIVE = (RUNNING, TAKEN_OVER)

    job = models.CharField(max_length=200)
    tick = models.BigIntegerField(help_text="floor(unix time / every)")
    due_at = models.DateTimeField(help_text="when the tick began")
    runner = models.CharField(max_length=200, help_text="host:pid of the runner that has (or had) the tick")
    fence = models.BigIntegerField(help_text="the runner's fence (job lock); results are written only with it")
    started_at = models.DateTimeField(help_text="when this runner started the tick")
    lease_until = models.DateTimeField(help_text="after this, another runner may take an unfinished tick over")
    finished_at = models.DateTimeField(null=True, blank=True)
    duration = models.FloatField(null=True, blank=True, help_text="seconds")
    outcome = models.CharField(max_length=16, choices=OUTCOMES, default=RUNNING)
    takeovers = models.PositiveIntegerField(default=0)
    taken_over_from = models.CharField(max_length=200, blank=True, help_text="the runner (and fence) it was taken from")
    detail = models.TextField(blank=True, help_text="what the job returned")
    error = models.TextField(blank=True)
    # The job found nothing to do (it returned `jobs.Idle`). Such rows are folded into the job's
    # JobIdleRuns count once no runner can look at their tick again (locks/jobs.py).
    idle = models.BooleanField(default=False, help_text="the run found nothing to do")

    class Meta:
        ordering = ["-due_at", "job"]
        constraints = [models.UniqueConstraint(fields=["job", "tick"], name="locks_jobrun_once_per_tick")]
        indexes = [models.Index(fields=["due_at"], name="locks_jobrun_due_at")]
        verbose_name = "job run"

    def __str__(self) -> str:
        return f"{self.job} tick {self.tick}: {self.outcome}"


class JobIdleRuns(models.Model):
    """Per job: how many of its runs found nothing to do and are no longer kept as JobRun rows.
    A job every 5 s once kept 17,000 rows a day of "sent 0"; only runs that did something or
    failed are kept now, and the idle ones are counted here."""

    job = models.CharField(max_length=200, unique=True)
    runs = models.PositiveBigIntegerField(default=0, help_text="idle runs counted (their rows deleted)")
    last_at = models.DateTimeField(null=True, blank=True, help_text="when the last of them was due")

    class Meta:
        ordering = ["job"]
        verbose_name = "job's idle runs"
        verbose_name_plural = "jobs' idle runs"

    def __str__(self) -> str:
        return f"{self.job}: {self.runs} idle runs"


class LockRow(models.Model):
    """One lock of the MySQL lock backend (locks/backends/mysql.py), by name.

    Written only by that backend's own SQL, on the database server's clock. The row outlives
    its holders because it keeps the fence; a free row (lease_until passed) is pruned once it
    has been free for FENCE_TTL (locks.prune), after which fences fall back to the clock.
    """

    name = models.CharField(max_length=200, primary_key=True, db_collation="utf8mb4_bin")
    token = models.CharField(max_length=32, blank=True, default="", help_text="the holder's token; '' once released")
    owner = models.CharField(max_length=200, blank=True, default="", help_text="host:pid of the last holder")
    fence = models.BigIntegerField(help_text="the last holder's fence (µs since the epoch, or last + 1)")
    lease_until = models.BigIntegerField(help_text="µs since the epoch (server clock): held until then")
    since = models.BigIntegerField(help_text="µs since the epoch (server clock) the last holder took it")
    holder_conn = models.BigIntegerField(default=0, help_text="the holder's MySQL connection id (CONNECTION_ID())")

    class Meta:
        indexes = [models.Index(fields=["lease_until"], name="locks_lockrow_lease_until")]
        verbose_name = "lock row"

    def __str__(self) -> str:
        return f"{self.name} (fence {self.fence})"
