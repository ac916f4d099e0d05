"""Logging and error reports."""

from config.settings.environment import value

# Tracebacks and error reports mask passwords inside URLs (DATABASE_URL, REDIS_URL...).
DEFAULT_EXCEPTION_REPORTER_FILTER = "config.reporting.SafeUrlExceptionReporterFilter"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"not_refusals": {"()": "config.reporting.NotRefusals"}},
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": value("LOG_LEVEL")},
    # Django logs every 4xx as a warning; in a flash sale most answers are 409 out_of_stock by
    # design, and a storm of them would cost a log line each. Server errors are still logged,
    # but not the 503s the shop answers on purpose (busy, lock_timeout: a crowd's excess).
    "loggers": {"django.request": {"level": value("REQUEST_LOG_LEVEL"), "filters": ["not_refusals"]}},
}
