"""Traffic samples in the embedded store's SQLite file (table `router_samples`).

Its own connection on its own worker thread: the cache's connection stays the cache's, and
WAL journaling lets both write the one file.
"""

from __future__ import annotations  # annotations below name `list` beside a method of that name

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from gateway.cache.samples import LIST_LIMIT, Sample
from gateway.cache.store import StoreUnavailable

SCHEMA = """
CREATE TABLE IF NOT EXISTS router_samples (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    route TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS router_samples_by_owner ON router_samples (tenant, route, created_at);
"""
T = TypeVar("T")


class SqliteSamples:
    kind = "embedded"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="router-samples")
        self._db: sqlite3.Connection | None = None

    async def add(self, sample: Sample, max_samples: int) -> None:
        await self._call(self._add, sample, max_samples)

    async def list(
        self, tenant: str | None, route: str | None, limit: int = LIST_LIMIT
    ) -> list[Sample]:
        where, values = _owner(tenant, route)
        sql = (
            f"SELECT body FROM router_samples WHERE {where} AND expires_at > ?"
            " ORDER BY created_at LIMIT ?"
        )
        rows = await self._call(self._rows, sql, (*values, time.time(), limit))
        return [Sample.from_json(row[0]) for row in rows]

    async def purge(self, tenant: str | None, route: str | None) -> int:
        where, values = _owner(tenant, route)
        sql = f"DELETE FROM router_samples WHERE {where} RETURNING id"
        return len(await self._call(self._rows, sql, values))

    async def close(self) -> None:
        if self._db is not None:
            await self._call(self._db.close)
            self._db = None
        self._executor.shutdown(wait=True)

    # --- on the worker thread ----------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except (sqlite3.Error, OSError) as exc:  # a broken file, or a folder it cannot make
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.executescript(SCHEMA)
            self._db = db
        return self._db

    def _add(self, sample: Sample, max_samples: int) -> None:
        db = self._connection()
        owner = (sample.tenant, sample.route)
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "DELETE FROM router_samples WHERE tenant = ? AND route = ? AND expires_at <= ?",
                (*owner, time.time()),
            )
            db.execute(
                "INSERT OR REPLACE INTO router_samples VALUES (?, ?, ?, ?, ?, ?)",
                (sample.id, *owner, sample.created_at, sample.expires_at, sample.to_json()),
            )
            db.execute(
                "DELETE FROM router_samples WHERE id IN (SELECT id FROM router_samples"
                " WHERE tenant = ? AND route = ? ORDER BY created_at DESC LIMIT -1 OFFSET ?)",
                (*owner, max_samples),
            )
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _rows(self, sql: str, values: tuple) -> list[tuple]:
        return self._connection().execute(sql, values).fetchall()


def _owner(tenant: str | None, route: str | None) -> tuple[str, tuple]:
    conditions = [(c, v) for c, v in (("tenant", tenant), ("route", route)) if v is not None]
    where = " AND ".join(f"{c} = ?" for c, _ in conditions) or "1"
    return where, tuple(v for _, v in conditions)
