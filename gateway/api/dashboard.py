"""GET /admin: the operator's dashboard, and the few static files it loads.

The page is public and holds no data: it asks for the admin key, keeps it in the tab's
sessionStorage and calls /admin/stats and /admin/policy with it. Everything it needs is
served from here (no CDN), so it works on a machine without internet access.
"""

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

from engine.entrypoints.openai.errors import OpenAIError

router = APIRouter()

_STATIC = Path(__file__).parent / "static"
_TYPES = {
    "chart.js": "text/javascript",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
# Only this gateway's own files run in the page; no inline script, no third party.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _file(name: str, media_type: str) -> Response:
    body = (_STATIC / name).read_bytes()
    return Response(body, media_type=f"{media_type}; charset=utf-8", headers=_HEADERS)


@router.get("/admin", include_in_schema=False)
async def dashboard() -> Response:
    return _file("dashboard.html", "text/html")


@router.get("/admin/static/{name}", include_in_schema=False)
async def static_file(name: str) -> Response:
    media_type = _TYPES.get(name)  # a fixed list: no path ever reaches the file system
    if media_type is None:
        raise OpenAIError(404, f"No static file {name!r}.", code="not_found")
    return _file(name, media_type)
