"""Settings, read from the environment with working local defaults (DJANGO_SETTINGS_MODULE=config.settings).

One module per concern, each reading its environment variables through the one table of them,
`environment.py` (name, meaning, default, how it is read and checked: a mistake fails at start
with a message that names the variable). docs/configuration.md's table lists the same names
(tests/config/test_environment.py):

    environment  the table of variables, `value(NAME)`, the `.env` / `.env.dev` files
    core         DEBUG, SECRET_KEY, hosts, apps, middleware, templates, auth, language, static files
    database     DATABASES (MySQL/MariaDB only)
    redis_locks  CACHES (Redis) and LOCKS (which service holds the locks)
    shop_values  SHOP (overrides of shop/conf.py) and SHOP_CURRENCY
    ratelimits   django-ratelimit
    metrics      /metrics access
    mail         EMAIL_*, DEFAULT_FROM_EMAIL, SERVER_EMAIL, SITE_URL
    security     HTTPS, HSTS, cookies, sessions
    logs         LOGGING, the error reports' filter

They are imported in the order their values are read and checked (a start with several mistakes
names the first); `mail` reads DEBUG from `core`.
"""
# isort: skip_file

from config.settings.environment import DEBUG_FROM_FILE, DEFAULT_DEV_ENV_FILE  # noqa: F401  (config/reporting.py)
from config.settings.core import *  # noqa: F403
from config.settings.database import *  # noqa: F403
from config.settings.redis_locks import *  # noqa: F403
from config.settings.shop_values import *  # noqa: F403
from config.settings.ratelimits import *  # noqa: F403
from config.settings.metrics import *  # noqa: F403
from config.settings.mail import *  # noqa: F403
from config.settings.security import *  # noqa: F403
from config.settings.logs import *  # noqa: F403
