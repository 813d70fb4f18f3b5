"""Session-wide real services: one redis-server for the whole test run."""

from collections.abc import Iterator

import pytest

from tests.servers import run_redis


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with run_redis() as url:
        yield url
