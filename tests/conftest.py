"""Shared fixtures: one redis-server for the whole test run, one torch thread, the cache's
embedder, and the C kernels loaded afresh or turned off for a test."""

import contextlib
import ctypes
import gc
from collections.abc import Iterator

import pytest
import torch

from gateway.embedding.embedder import Embedder
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


@pytest.fixture(scope="module")
def embedder(one_torch_thread: None) -> Embedder:
    """The cache's embedder (ONNX Runtime), no batching wait: for the pair verifiers' tests."""
    return Embedder(max_wait_ms=0)


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a module's fixtures are torn down, collect its cycles and give freed heap back:
    the session starts one in-process model gateway per module, and a full collection may
    not come for many modules otherwise (CI was killed for memory at 90% of the suite)."""
    result = yield
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    return result
