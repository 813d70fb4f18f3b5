"""Shared fixtures: one redis-server for the whole test run, one torch thread, and the C
kernels loaded afresh or turned off for a test."""

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


@pytest.fixture
def fresh_kernels() -> Iterator[None]:
    """The C kernels loaded afresh in this test and after it: `native.kernels()` caches its
    first answer, so a test that turns them off must not leave that to the next test."""
    from engine import native

    native.kernels.cache_clear()
    yield
    native.kernels.cache_clear()


@pytest.fixture
def no_kernels(fresh_kernels: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C kernels off for this test (TIERGATE_NATIVE=0): whatever it builds takes the
    torch path."""
    monkeypatch.setenv("TIERGATE_NATIVE", "0")
