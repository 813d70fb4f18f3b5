"""The audit trail of admin actions: who (a fingerprint of the admin key, never the key),
what, and with which arguments, on the `tiergate.audit` logger."""

import logging

from fastapi import Request

from gateway.policy import key_digest

audit_log = logging.getLogger("tiergate.audit")


def key_fingerprint(key: str) -> str:
    """Short and stable across restarts, so log lines of one key can be grouped."""
    return "key:" + key_digest(key.encode())[:10]


def audit(request: Request, action: str, **details: object) -> None:
    """Log one admin action; `require_admin` stored the caller's fingerprint."""
    who = getattr(request.state, "admin", "unknown")
    args = " ".join(f"{name}={value!r}" for name, value in details.items())
    audit_log.info("%s by %s%s", action, who, f" {args}" if args else "")
