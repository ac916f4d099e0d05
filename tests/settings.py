"""Settings for the test suite: the project's own, plus a test-only SECRET_KEY.

DEBUG is off unless the environment turns it on, and with DEBUG off the project refuses to start
without a SECRET_KEY. Tests (and the management commands they start in subprocesses, which
inherit this environment) get a throwaway key instead of the developer having to export one.
"""

import os

os.environ.setdefault("SECRET_KEY", "tests-only-insecure-key-" + "x" * 40)
# The same settings whether or not ./dev.sh wrote a .env.dev here (inherited by subprocesses).
os.environ.setdefault("DEV_ENV_FILE", "")

from config.settings import *  # noqa: F403

# Password hashing is not what these tests test: the fast hasher saves seconds per created user.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Test buyers place many orders and rarely pay; the unpaid-orders limit (default 5) is switched on
# by the tests of that limit (tests/shop/services/test_unpaid_limit.py).
SHOP = {**SHOP, "MAX_UNPAID_ORDERS": None}  # noqa: F405
