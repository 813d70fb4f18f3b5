"""The embedded store: one SQLite file, no server, survives restarts (`cache.store: embedded`).

Every call runs on one worker thread that owns the connection, so SQLite never blocks the
event loop. WAL journaling with synchronous=NORMAL: a commit costs no fsync, and a crash
loses at most the last few entries, never the file.
"""

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np

from gateway.cache.entry import CachedAnswer, Entry, facts_only
from gateway.cache.store import MAX_RECORDS, StoreUnavailable, answer_from_json, answer_to_json

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id TEXT PRIMARY KEY,
    scope TEXT NOT NULL,
    tenant TEXT NOT NULL,
    route TEXT NOT NULL,
    question TEXT NOT NULL,
    vector BLOB NOT NULL,
    answer TEXT NOT NULL,
    finish_reason TEXT NOT NULL,
    completion_tokens INTEGER NOT NULL,
    max_tokens INTEGER,
    created_at REAL NOT NULL,
    expires_at REAL,
    last_used REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_by_last_used ON entries (last_used);
CREATE INDEX IF NOT EXISTS entries_by_tenant_route ON entries (tenant, route);
CREATE TABLE IF NOT EXISTS records (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS records_by_expiry ON records (expires_at);
"""
T = TypeVar("T")
# What loading reads: everything but the answer text, which only a hit needs.
LOAD_COLUMNS = (
    "id, scope, tenant, route, question, vector, finish_reason, completion_tokens, max_tokens,"
    " created_at, expires_at"
)
RETRY_S = 5.0  # after an error, requests bypass the store this long before trying it again
MISSING_BATCH = 500  # ids per query: under SQLite's bound on parameters
INSERT = f"INSERT OR REPLACE INTO entries VALUES ({', '.join('?' * 13)})"


class SqliteStore:
    kind = "embedded"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="cache-sqlite")
        self._db: sqlite3.Connection | None = None
        self._count = 0
        self._error: str | None = None
        self._failed_at = 0.0  # monotonic time of the last error

    @property
    def healthy(self) -> bool:
        """Open, and no error in the last RETRY_S (then the next call tries again: a full
        disk may have room by now)."""
        recent = self._error is not None and time.monotonic() - self._failed_at < RETRY_S
        return self._db is not None and not recent

    async def load(self) -> list[Entry]:
        return await self._call(self._open_and_load)

    async def put(self, entry: Entry, max_entries: int) -> list[str]:
        return await self._call(self._put, entry, max_entries)

    async def put_many(self, entries: list[Entry]) -> None:
        """Bulk insert with no eviction (benchmarks, imports)."""
        await self._call(self._put_many, entries)

    async def get(self, entry_id: str) -> CachedAnswer | None:
        row = await self._call(self._one, "SELECT answer FROM entries WHERE id = ?", entry_id)
        return answer_from_json(row[0]) if row else None

    async def touch(self, entry_id: str, now: float) -> None:
        await self._call(
            self._write, "UPDATE entries SET last_used = ? WHERE id = ?", now, entry_id
        )

    async def delete(self, ids: list[str]) -> list[str]:
        return await self._call(self._delete, ids)

    async def missing(self, ids: list[str]) -> list[str]:
        return await self._call(self._missing, ids)

    async def forget_expired(self, ids: list[str]) -> None:
        await self._call(self._delete, ids)

    async def purge(self, tenant: str | None, route: str | None) -> list[str]:
        return await self._call(self._purge, tenant, route)

    async def put_record(self, key: str, value: str, ttl_s: float) -> None:
        await self._call(self._put_record, key, value, time.time() + ttl_s)

    async def get_record(self, key: str) -> str | None:
        sql = "SELECT value FROM records WHERE key = ? AND expires_at > ?"
        row = await self._call(self._one, sql, key, time.time())
        return row[0] if row else None

    async def delete_record(self, key: str) -> bool:
        sql = "DELETE FROM records WHERE key = ? RETURNING key"
        return await self._call(self._one, sql, key) is not None

    def info(self) -> dict:
        return {
            "kind": self.kind,
            "path": str(self.path),
            "healthy": self.healthy,
            "error": self._error,
        }

    async def close(self) -> None:
        if self._db is not None:
            await self._call(self._db.close)
            self._db = None
        self._executor.shutdown(wait=True)

    # --- on the worker thread ----------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._executor, fn, *args)
        except sqlite3.Error as exc:  # a full disk or a broken file: bypass, never corrupt
            self._error = f"{type(exc).__name__}: {exc}"
            self._failed_at = time.monotonic()
            raise StoreUnavailable(self._error) from exc
        self._error = None
        return result

    def _open_and_load(self) -> list[Entry]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.executescript(SCHEMA)
        self._db = db
        db.execute(
            "DELETE FROM entries WHERE expires_at IS NOT NULL AND expires_at <= ?", (time.time(),)
        )
        rows = db.execute(f"SELECT {LOAD_COLUMNS} FROM entries").fetchall()
        self._count = len(rows)
        return [_entry(row) for row in rows]

    def _put(self, entry: Entry, max_entries: int) -> list[str]:
        db = self._connection()
        with _transaction(db):
            existed = db.execute("SELECT 1 FROM entries WHERE id = ?", (entry.id,)).fetchone()
            db.execute(INSERT, (*_row(entry), entry.created_at))
            self._count += 0 if existed else 1
            if self._count <= max_entries:
                return []
            evicted = db.execute(
                "DELETE FROM entries WHERE id IN "
                "(SELECT id FROM entries WHERE id != ? ORDER BY last_used LIMIT ?) RETURNING id",
                (entry.id, self._count - max_entries),
            ).fetchall()
        self._count -= len(evicted)
        return [row[0] for row in evicted]

    def _put_many(self, entries: list[Entry]) -> None:
        db = self._connection()
        with _transaction(db):
            db.executemany(INSERT, [(*_row(e), e.created_at) for e in entries])
        self._count = db.execute("SELECT count(*) FROM entries").fetchone()[0]

    def _delete(self, ids: list[str]) -> list[str]:
        db = self._connection()
        deleted = []
        with _transaction(db):
            for entry_id in ids:
                row = db.execute("DELETE FROM entries WHERE id = ? RETURNING id", (entry_id,))
                deleted += [r[0] for r in row.fetchall()]
        self._count -= len(deleted)
        return deleted

    def _missing(self, ids: list[str]) -> list[str]:
        held: set[str] = set()
        for start in range(0, len(ids), MISSING_BATCH):
            batch = ids[start : start + MISSING_BATCH]
            marks = ", ".join("?" * len(batch))
            sql = f"SELECT id FROM entries WHERE id IN ({marks})"
            rows = self._connection().execute(sql, batch)
            held.update(row[0] for row in rows)
        return [i for i in ids if i not in held]

    def _purge(self, tenant: str | None, route: str | None) -> list[str]:
        conditions = [(c, v) for c, v in (("tenant", tenant), ("route", route)) if v is not None]
        where = " AND ".join(f"{c} = ?" for c, _ in conditions) or "1"
        rows = self._connection().execute(
            f"DELETE FROM entries WHERE {where} RETURNING id", [v for _, v in conditions]
        )
        deleted = [r[0] for r in rows.fetchall()]
        self._count -= len(deleted)
        return deleted

    def _put_record(self, key: str, value: str, expires_at: float) -> None:
        db = self._connection()
        with _transaction(db):
            db.execute("DELETE FROM records WHERE expires_at <= ?", (time.time(),))
            db.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?)", (key, value, expires_at))
            db.execute(
                "DELETE FROM records WHERE key IN (SELECT key FROM records"
                " ORDER BY expires_at DESC LIMIT -1 OFFSET ?)",
                (MAX_RECORDS,),
            )

    def _one(self, sql: str, *args: object) -> tuple | None:
        return self._connection().execute(sql, args).fetchone()

    def _write(self, sql: str, *args: object) -> None:
        self._connection().execute(sql, args)

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise sqlite3.OperationalError("the cache store is closed")
        return self._db


class _transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


def _row(entry: Entry) -> tuple:
    answer = entry.answer
    vector = np.asarray(entry.vector, dtype=np.float32).tobytes()
    return (
        entry.id,
        entry.scope,
        entry.tenant,
        entry.route,
        entry.question,
        vector,
        answer_to_json(answer),
        answer.finish_reason,
        answer.completion_tokens,
        answer.max_tokens,
        entry.created_at,
        entry.expires_at,
    )


def _entry(row: tuple) -> Entry:
    entry_id, scope, tenant, route, question, vector, finish, completion, limit = row[:9]
    created_at, expires_at = row[9:]
    answer = facts_only(finish, completion, limit)
    return Entry(
        entry_id,
        scope,
        tenant,
        route,
        question,
        np.frombuffer(vector, np.float32),
        answer,
        created_at,
        expires_at,
    )
