"""Prometheus /metrics (shop/ops/metrics.py, docs/metrics.md): off (404) unless a bearer token and/or
allowed client networks (CIDRs, matched against REMOTE_ADDR only) are set."""

from config.settings.environment import value

METRICS_TOKEN = value("METRICS_TOKEN")
METRICS_ALLOWED_IPS = value("METRICS_ALLOWED_IPS")
