"""Hot reload: the policy file (and the example files it lists) watched by mtime, each
valid new policy applied."""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from gateway.policy.loading import policy_from_text, read_policy_text
from gateway.policy.schema import Policy, PolicyError

logger = logging.getLogger("tiergate.policy")


class PolicyWatcher:
    """Polls the policy file's mtime, and its difficulty example files' (so a new examples
    file from `tiergate router learn` is picked up), and calls `apply` with each new valid
    policy.

    An invalid file leaves the running policy in force: the error is logged and kept in
    `last_error` (shown by GET /admin/policy) until a later load succeeds. Policy text from
    elsewhere (another gateway replica) goes through the same checks (`apply_text`).
    """

    def __init__(
        self,
        path: Path,
        apply: Callable[[Policy], Awaitable[None]],
        interval_s: float = 1.0,
        on_result: Callable[[bool], None] | None = None,
        examples: list[Path] | None = None,
    ) -> None:
        self.path = path
        self.examples = examples or []  # the running policy's example files, also watched
        self._apply = apply  # raises PolicyError to refuse a policy it cannot put in force
        self.interval_s = interval_s
        self._on_result = on_result or (lambda ok: None)
        # Called with the file's text after it was put in force (e.g. to share it).
        self.on_loaded: Callable[[str], Awaitable[object]] | None = None
        self.last_error: PolicyError | None = None
        self._mtime = self._current_mtime()
        self._lock = asyncio.Lock()

    def _current_mtime(self) -> tuple[int | None, ...]:
        return tuple(_mtime(p) for p in (self.path, *self.examples))

    def read(self) -> str:
        return read_policy_text(self.path)

    async def reload(self) -> Policy | None:
        """Load and apply the file now; returns the new policy, or None when it is invalid."""
        async with self._lock:
            self._mtime = self._current_mtime()
            try:
                text = await asyncio.to_thread(self.read)
            except PolicyError as exc:
                self.refuse(exc)
                return None
            policy = await self._load(text, str(self.path))
            if policy is not None and self.on_loaded is not None:
                await self.on_loaded(text)
            return policy

    async def apply_text(
        self, text: str, source: str, still_wanted: Callable[[], bool] = lambda: True
    ) -> Policy | None:
        """Apply policy text from `source` as if it were the file's (relative paths resolve
        beside the file); None when it is invalid here (the running policy kept), or when
        `still_wanted()` says no once the reload before it is done."""
        async with self._lock:
            if not still_wanted():
                return None
            return await self._load(text, source)

    async def _load(self, text: str, source: str) -> Policy | None:
        try:
            policy = await asyncio.to_thread(policy_from_text, text, self.path, None, source)
            await self._apply(policy)
        except PolicyError as exc:
            self.refuse(exc)
            return None
        self.examples = example_files(policy)
        self._mtime = self._current_mtime()
        self.last_error = None
        self._on_result(True)
        logger.info("policy reloaded from %s", source)
        return policy

    def refuse(self, exc: PolicyError) -> None:
        """Keep the running policy, and show and count why `exc`'s policy was not applied."""
        self.last_error = exc
        self._on_result(False)
        logger.error("policy reload refused, keeping the running policy: %s", exc)

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


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def example_files(policy: Policy) -> list[Path]:
    """The example files a loaded policy lists (made absolute when it was loaded)."""
    return [Path(e) for e in policy.difficulty.examples if isinstance(e, str)]
