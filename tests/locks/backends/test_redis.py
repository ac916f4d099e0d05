"""The backend contract on the built-in Redis backend (the shared Redis on 6379)."""

from __future__ import annotations

import pytest

from locks.backends import get_backend
from tests.locks.backends.contract import *  # noqa: F403 - the contract's tests run here


@pytest.fixture
def backend(settings):
    settings.LOCKS = {**settings.LOCKS, "BACKEND": "redis"}
    backend = get_backend()
    assert backend.name == "redis" and backend.supports_combining
    return backend
