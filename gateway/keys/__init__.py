"""Managed API keys: made, listed and revoked over /admin/keys, kept in a shared store."""

from gateway.keys.record import ManagedKey, new_key
from gateway.keys.store import KeyStore, KeyStoreError, RedisKeys, SqliteKeys
from gateway.policy import Policy

__all__ = ["KeyStoreError", "ManagedKey", "ManagedKeys", "new_key"]


class ManagedKeys:
    """Lives as long as the gateway; the store follows the running policy (its Redis, else
    its SQLite file), reopened when a reload moves it."""

    def __init__(self) -> None:
        self._store: KeyStore | None = None
        self._where: str | None = None

    async def store(self, policy: Policy) -> KeyStore:
        url = policy.limits_redis_url()
        where = url or str(policy.auth.managed_keys_file())
        if self._store is None or self._where != where:
            if self._store is not None:
                await self._store.close()
            self._store = RedisKeys(url) if url else SqliteKeys(policy.auth.managed_keys_file())
            self._where = where
        return self._store

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
