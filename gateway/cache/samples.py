"""Traffic samples for `tiergate router learn`: requests a route chose to keep (its
`learn.sample_rate`), with the tier that served them and its answer.

They live in the cache's store (the same SQLite file, or the same Redis under
`cache.redis_prefix`), whether or not the cache itself is on: per tenant and route, at most
`learn.max_samples` (the oldest dropped first), each for `learn.retention_days`. A tenant's
samples are listed, exported and purged through /admin/router/samples, never another's.
"""

from __future__ import annotations  # annotations below name `list` beside a method of that name

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

LIST_LIMIT = 10_000  # most samples one listing returns


@dataclass
class Sample:
    tenant: str
    route: str
    messages: list[dict[str, Any]]  # the request's chat messages ({role, content} each)
    tier: str  # the tier that served it
    model: str  # the deployment that answered
    answer: str
    max_tokens: int | None = None  # what the request asked for
    prompt_tokens: int = 0
    completion_tokens: int = 0
    created_at: float = field(default_factory=time.time)
    expires_at: float = 0.0
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> Sample:
        return cls(**json.loads(text))

    @property
    def last_user_text(self) -> str:
        users = [m for m in self.messages if m.get("role") == "user"]
        return str(users[-1].get("content") or "") if users else ""


class SampleStore(Protocol):
    kind: str

    async def add(self, sample: Sample, max_samples: int) -> None:
        """Keep the sample (its `expires_at` set); drop its tenant and route's expired ones,
        and the oldest beyond `max_samples`."""
        ...

    async def list(
        self, tenant: str | None, route: str | None, limit: int = LIST_LIMIT
    ) -> list[Sample]:
        """Live samples of a tenant and/or route (None: any), oldest first."""
        ...

    async def purge(self, tenant: str | None, route: str | None) -> int:
        """Remove a tenant's and/or route's samples (None: any); how many were removed."""
        ...

    async def close(self) -> None: ...
