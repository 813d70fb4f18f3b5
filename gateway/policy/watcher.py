"""Hot reload: the policy file watched by its mtime, each valid new policy applied."""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from gateway.policy.loading import load_policy
from gateway.policy.schema import Policy, PolicyError

logger = logging.getLogger("tiergate.policy")


class PolicyWatcher:
    """Polls the policy file's mtime and calls `apply` with each new valid policy.

    An invalid file leaves the running policy in force: the error is logged and kept in
    `last_error` (shown by GET /admin/policy) until a later load succeeds.
    """

    def __init__(
        self,
        path: Path,
        apply: Callable[[Policy], Awaitable[None]],
        interval_s: float = 1.0,
        on_result: Callable[[bool], None] | None = None,
    ) -> None:
        self.path = path
        self._apply = apply  # raises PolicyError to refuse a policy it cannot put in force
        self.interval_s = interval_s
        self._on_result = on_result or (lambda ok: None)
        self.last_error: PolicyError | None = None
        self._mtime = self._current_mtime()
        self._lock = asyncio.Lock()

    def _current_mtime(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    async def reload(self) -> Policy | None:
        """Load and apply the file now; returns the new policy, or None when it is invalid."""
        async with self._lock:
            self._mtime = self._current_mtime()
            try:
                policy = await asyncio.to_thread(load_policy, self.path)
                await self._apply(policy)
            except PolicyError as exc:
                self.last_error = exc
                self._on_result(False)
                logger.error("policy reload refused, keeping the running policy: %s", exc)
                return None
            self.last_error = None
            self._on_result(True)
            logger.info("policy reloaded from %s", self.path)
            return policy

    async def watch(self) -> None:
        """Run until cancelled; reloads whenever the file's mtime changes."""
        while True:
            await asyncio.sleep(self.interval_s)
            if self._current_mtime() == self._mtime:
                continue
            try:
                await self.reload()
            except Exception:  # a bug in one reload must not end hot reload for good
                logger.exception("policy reload failed")
