"""Which of a tier's deployments (replicas) gets a request first.

`ordered`: the policy's list is a preference (the next ones are fallbacks).
`round_robin`: each request starts one further along the list.
`least_outstanding`: the replica with the fewest requests in flight from this gateway.
`prefix_affinity`: the replica that most recently served the request's prefix (system
prompt, earlier turns, the head of a long prompt), whose engine likely still holds its KV
pages, unless it has more than `affinity_slack` requests in flight above the least
loaded one; then, or when no replica served the prefix, least outstanding.

This follows SGLang's cache-aware router in spirit: a prefix counts only when it covers
at least half of the prompt's head (a shared one-line preamble must not pin every request
to one replica), and load wins over affinity once the replicas are unbalanced. Prefixes
are hashed per tenant, as engines salt their prefix pages per tenant.

Replicas a health probe found dead are skipped until a probe finds them alive again.
"""

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.backends.base import GenerationRequest

BLOCK_CHARS = 256  # prefixes are compared in blocks of this many characters
MIN_MATCH = 0.5  # share of the prompt's head a known prefix must cover to count
MAX_PREFIXES = 200_000  # remembered prefix blocks (LRU); ~100 bytes each
PREFIX_CHARS = 16_384  # the head of the prompt that is hashed (~4k tokens)


@dataclass(frozen=True)
class Prefixes:
    """Chained hashes of the prompt's full blocks, shortest first, and the head's length."""

    hashes: list[bytes]
    head_chars: int  # characters considered (the whole prompt, up to prefix_chars)


def prompt_text(request: GenerationRequest) -> str:
    """The prompt as one string in the order an engine sees it: roles and contents."""
    body = request.body
    if not request.is_chat:
        prompt = body.prompt  # type: ignore[union-attr]
        return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    parts = []
    for message in body.messages:  # type: ignore[union-attr]
        content = message.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        parts.append(f"\x1e{message.role}\x1f{content or ''}")
    return "".join(parts)


def prefixes_of(request: GenerationRequest, prefix_chars: int = PREFIX_CHARS) -> Prefixes:
    text = prompt_text(request)[:prefix_chars]
    digest = hashlib.blake2b(request.tenant.encode(), digest_size=16).digest()
    hashes = []
    for start in range(0, len(text) - BLOCK_CHARS + 1, BLOCK_CHARS):
        block = text[start : start + BLOCK_CHARS].encode()
        digest = hashlib.blake2b(digest + block, digest_size=16).digest()
        hashes.append(digest)
    return Prefixes(hashes, len(text))


class Balancer:
    """Load and prefix owners of every replica, kept across policy reloads (keyed by
    deployment key, model@api_base)."""

    def __init__(self, max_prefixes: int = MAX_PREFIXES) -> None:
        self.outstanding: dict[str, int] = {}
        self._owners: OrderedDict[tuple[str, bytes], str] = OrderedDict()
        self._max_prefixes = max_prefixes
        self._turns: dict[str, itertools.count] = {}
        self._down: set[str] = set()

    # ---------------------------------------------------------------- decisions

    def order(
        self,
        tier: str,
        mode: str,
        keys: Sequence[str],
        prefixes: Prefixes | None = None,
        slack: int = 8,
    ) -> list[int]:
        """Indices of `keys` (one tier's replicas, in policy order) in the order to try."""
        indices = list(range(len(keys)))
        if mode == "ordered" or len(keys) < 2:
            return indices
        turn = next(self._turns.setdefault(tier, itertools.count())) % len(keys)
        rotated = indices[turn:] + indices[:turn]  # ties go round, not always to the first
        if mode == "round_robin":
            return rotated
        by_load = sorted(rotated, key=lambda i: self.outstanding.get(keys[i], 0))
        if mode == "prefix_affinity" and prefixes is not None:
            owner = self._owner(tier, keys, prefixes)
            if owner is not None and self._within_slack(keys, owner, by_load[0], slack):
                by_load.remove(owner)
                by_load.insert(0, owner)
        return by_load

    def _owner(self, tier: str, keys: Sequence[str], prefixes: Prefixes) -> int | None:
        """The replica that last served the longest known prefix, if it covers enough."""
        for count in range(len(prefixes.hashes), 0, -1):
            if count * BLOCK_CHARS < MIN_MATCH * prefixes.head_chars:
                return None
            key = self._owners.get((tier, prefixes.hashes[count - 1]))
            if key is not None and key in keys:
                return keys.index(key)
        return None

    def _within_slack(self, keys: Sequence[str], owner: int, least: int, slack: int) -> bool:
        load = self.outstanding.get(keys[owner], 0)
        return load - self.outstanding.get(keys[least], 0) <= slack

    # ---------------------------------------------------------------- bookkeeping

    def started(self, key: str) -> None:
        self.outstanding[key] = self.outstanding.get(key, 0) + 1

    def finished(self, key: str) -> None:
        self.outstanding[key] = max(0, self.outstanding.get(key, 0) - 1)

    def served(self, tier: str, prefixes: Prefixes | None, key: str) -> None:
        """`key` answered a request with these prefixes: it owns them now."""
        if prefixes is None:
            return
        for digest in prefixes.hashes:
            self._owners[(tier, digest)] = key
            self._owners.move_to_end((tier, digest))
        while len(self._owners) > self._max_prefixes:
            self._owners.popitem(last=False)

    # ---------------------------------------------------------------- health

    def is_down(self, key: str) -> bool:
        return key in self._down

    def down_keys(self) -> set[str]:
        return set(self._down)

    def mark(self, key: str, alive: bool) -> bool:
        """Record a probe's verdict; True when it changed."""
        if alive == (key not in self._down):
            return False
        if alive:
            self._down.discard(key)
        else:
            self._down.add(key)
        return True
