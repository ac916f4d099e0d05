"""Settings, read from the environment with working local defaults (DJANGO_SETTINGS_MODULE=shop.settings).

One module per concern, each reading its environment variables through the one table of them,
`environment.py` (name, meaning, default, how it is read and checked: a mistake fails at start
with a message that names the variable). The README's configuration table lists the same names
(tests/shop/test_environment.py):

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

from shop.settings.environment import DEBUG_FROM_FILE, DEFAULT_DEV_ENV_FILE  # noqa: F401  (shop/reporting.py)
from shop.settings.core import *  # noqa: F403
from shop.settings.database import *  # noqa: F403
from shop.settings.redis_locks import *  # noqa: F403
from shop.settings.shop_values import *  # noqa: F403
from shop.settings.ratelimits import *  # noqa: F403
from shop.settings.metrics import *  # noqa: F403
from shop.settings.mail import *  # noqa: F403
from shop.settings.security import *  # noqa: F403
from shop.settings.logs import *  # noqa: F403
