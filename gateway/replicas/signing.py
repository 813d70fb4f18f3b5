"""Shared policies are signed, so write access to the fleet's Redis is not enough to
change every replica's policy (e.g. to push `auth: {mode: none}`).

The signature is HMAC-SHA256 over the policy text's exact UTF-8 bytes, keyed by
TIERGATE_POLICY_SECRET, which every replica of a fleet is given. A replica without it
neither publishes its reloads nor applies anyone's: sharing policies needs the secret.
A signature does not say which text is newest: someone who can write to Redis can replay
an older signed policy, so rotate the secret when a policy must never come back.
"""

import hashlib
import hmac
import os
from collections.abc import Mapping

SECRET_ENV = "TIERGATE_POLICY_SECRET"


def policy_secret(env: Mapping[str, str] = os.environ) -> bytes | None:
    """The fleet's secret, or None when it is not set (or empty)."""
    secret = env.get(SECRET_ENV, "")
    return secret.encode() if secret else None


def sign(secret: bytes, text: str) -> str:
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def signed_by(secret: bytes, text: str, signature: str | None) -> bool:
    """Whether `signature` is this secret's over `text` (compared in constant time)."""
    return signature is not None and hmac.compare_digest(sign(secret, text), signature)
