"""The test harness itself: real Redis and real uvicorn answer on loopback."""

import httpx
import redis
from fastapi import FastAPI

from tests.servers import run_uvicorn


def test_redis_server_answers(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set("tiergate:probe", "1")
    assert client.get("tiergate:probe") == b"1"


def test_uvicorn_serves_app() -> None:
    app = FastAPI()

    @app.get("/ping")
    def ping() -> dict[str, str]:
        return {"pong": "yes"}

    with run_uvicorn(app) as base_url:
        assert httpx.get(f"{base_url}/ping").json() == {"pong": "yes"}
