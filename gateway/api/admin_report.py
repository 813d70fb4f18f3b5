"""POST /admin/cache/report: an operator flags a cache hit as a wrong answer.

The entry (named by the hit's `x-tiergate-cache-entry` header) is removed from the cache
and the report counted (`tiergate_cache_wrong_hits_reported_total`), so the wrong-hit
rate can be watched next to the hit rate.
"""

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.protocol import validation_error_message
from gateway.api.admin import Admin, State
from gateway.api.audit import audit
from gateway.errors import ApiError

router = APIRouter()


class WrongHitReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entry_id: str = Field(min_length=1, max_length=256)
    reason: str | None = Field(default=None, max_length=1000)  # kept in the audit log


@router.post("/admin/cache/report")
async def report_wrong_hit(request: Request, state: State, _: Admin) -> dict[str, Any]:
    try:
        body = WrongHitReport.model_validate_json(await request.body() or b"{}")
    except ValidationError as exc:
        message, param = validation_error_message(exc)
        raise ApiError(400, message, param=param) from None
    cache = getattr(state, "cache", None)
    if cache is None:
        raise ApiError(404, "The semantic cache is off in the running policy.", code="cache_off")
    if not await cache.invalidate(body.entry_id):
        raise ApiError(404, f"No cache entry {body.entry_id!r}.", code="entry_not_found")
    state.stats.wrong_hit_reported()
    audit(request, "cache wrong hit reported", entry_id=body.entry_id, reason=body.reason)
    return {"reported": body.entry_id, "removed": True}
