"""What an operator watches and runs: Prometheus metrics (docs/metrics.md), the invariants check,
the system checks and the scheduled jobs (`manage.py run_jobs`)."""
