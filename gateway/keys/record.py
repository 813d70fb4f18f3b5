"""A managed key (POST /admin/keys): its record, what the admin API shows of it, a new key."""

import secrets
import time

from pydantic import BaseModel

from gateway.limits.terms import KeyTerms
from gateway.policy import Budget, LimitSet, key_digest

KEY_PREFIX = "tg-"  # 32 random bytes after it: plain SHA-256 is enough against guessing


class ManagedKey(BaseModel):
    """What the store keeps: the key's SHA-256, never the key."""

    id: str
    name: str
    tenant: str
    digest: str
    created_at: float
    expires_at: float | None = None
    allowed_models: list[str] | None = None  # None: every name the gateway serves
    limits: LimitSet = LimitSet()
    budget: Budget = Budget()

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at

    def terms(self) -> KeyTerms:
        allowed = None if self.allowed_models is None else frozenset(self.allowed_models)
        return KeyTerms(self.digest, self.id, True, self.limits, self.budget, allowed)

    def public(self) -> dict:
        """The admin API's view: no secret, not even its hash."""
        shown = self.model_dump(mode="json", exclude={"digest"})
        return {"object": "api_key", **shown, "expired": self.expired()}


def new_key() -> tuple[str, str, str]:
    """A fresh key, its id and its SHA-256 hex (what authentication looks keys up by)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, "key_" + secrets.token_hex(8), key_digest(key.encode())
