"""Session-wide real services: one redis-server for the whole test run."""

from collections.abc import Iterator

import pytest
import torch

from tests.servers import run_redis


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with run_redis() as url:
        yield url


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One torch thread for a module: on a busy 2-core machine, OpenMP threads spin-waiting
    on a descheduled sibling make model tests 3-5x slower; results do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
