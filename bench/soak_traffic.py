"""The soak's traffic (bench/soak.py): one seeded mix of what clients send a gateway, each
kind one coroutine that returns what happened (status, seconds) instead of raising.

Every pool is bounded (questions, schemas, embedding inputs), so a gateway whose memory
follows its traffic plateaus once it has seen the pool: growth after that is a leak.
"""

import asyncio
import json
import random
import time
from dataclasses import dataclass

import httpx
import openai

# (question, a rewording the cache should answer from the first one's entry)
PAIRS = [
    ("What is the capital of France?", "Tell me the capital city of France."),
    ("How do magnets work?", "Explain how magnets work."),
    ("Why is the sky blue?", "What makes the sky look blue?"),
    ("What causes the tides?", "Why does the sea have tides?"),
    ("How many legs does a spider have?", "How many legs do spiders have?"),
    ("What is photosynthesis?", "Explain photosynthesis briefly."),
    ("Who wrote Hamlet?", "Which writer wrote the play Hamlet?"),
    ("What is the boiling point of water?", "At what temperature does water boil?"),
    ("How far is the Moon from Earth?", "What is the distance from the Earth to the Moon?"),
    ("What is a prime number?", "Define a prime number."),
    ("Write a Python function that reverses a string.", "Give me Python code to reverse a string."),
    ("What does HTTP stand for?", "What is HTTP short for?"),
]
# Mostly distinct prompts from a bounded space: misses at first, hits once it is covered.
FACTS = [f"What is {a} times {b}?" for a in range(2, 14) for b in range(2, 14)]
SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city"],
    },
    {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
BAD_BODIES = (
    b"{not json",
    b'{"model": "auto"}',
    b'{"model": "auto", "messages": []}',
    b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}',
    b'{"model": "auto", "messages": [{"role": "wizard", "content": "hi"}]}',
)
# Shares of the mix.
MIX = {
    "chat": 0.20,
    "stream": 0.14,
    "repeat": 0.10,
    "reword": 0.08,
    "completion": 0.08,
    "embeddings": 0.07,
    "structured": 0.07,
    "tools": 0.05,
    "leave_stream": 0.06,
    "leave_whole": 0.04,
    "bad_body": 0.05,
    "unknown_model": 0.03,
    "bad_key": 0.03,
}
MAX_TOKENS = 24
REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Outcome:
    kind: str
    status: str  # "200", "400", ...; "client_left" for a client that left on purpose
    seconds: float
    problem: str | None = None  # what was wrong with an answer whose status looked right


class Traffic:
    """The clients of several tenants; `one(rng)` sends one request of a random kind."""

    def __init__(self, base_url: str, keys: list[str]) -> None:
        self.base_url = base_url
        self.clients = [
            openai.AsyncOpenAI(
                base_url=f"{base_url}/v1", api_key=k, max_retries=0, timeout=REQUEST_TIMEOUT_S
            )
            for k in keys
        ]
        self.keys = keys
        self.http = httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S)
        self.asked: list[tuple[int, str]] = []  # (tenant, question) asked already
        self._kinds, self._weights = list(MIX), list(MIX.values())

    async def close(self) -> None:
        await self.http.aclose()
        for client in self.clients:
            await client.close()

    async def one(self, rng: random.Random) -> Outcome:
        kind = rng.choices(self._kinds, self._weights)[0]
        tenant = rng.randrange(len(self.clients))
        start = time.perf_counter()
        try:
            status, problem = await getattr(self, f"_{kind}")(rng, tenant)
        except openai.APIStatusError as exc:
            status, problem = str(exc.status_code), None
        except (openai.APIError, httpx.HTTPError) as exc:  # no answer: timeouts, dropped
            # connections (a POST on a keep-alive connection the server closed meanwhile too)
            status, problem = f"error:{type(exc).__name__}", None
        return Outcome(kind, status, round(time.perf_counter() - start, 3), problem)

    # --- chat ----------------------------------------------------------------------------

    def _question(self, rng: random.Random, tenant: int) -> str:
        pool = FACTS if rng.random() < 0.6 else [q for q, _ in PAIRS]
        question = rng.choice(pool)
        self.asked.append((tenant, question))
        del self.asked[:-500]  # the driver's own memory stays bounded too
        return question

    async def _ask(self, tenant: int, question: str, **extra: object) -> tuple[str, str | None]:
        reply = await self.clients[tenant].chat.completions.create(
            model=extra.pop("model", "auto"),
            messages=[{"role": "user", "content": question}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            **extra,
        )
        choice = reply.choices[0]
        empty = not choice.message.content and not choice.message.tool_calls
        return "200", "empty answer" if empty else None

    async def _chat(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        return await self._ask(tenant, self._question(rng, tenant))

    async def _repeat(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        if not self.asked:
            return await self._chat(rng, tenant)
        asked_by, question = rng.choice(self.asked)
        return await self._ask(asked_by, question)

    async def _reword(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        return await self._ask(tenant, rng.choice(PAIRS)[1])

    async def _stream(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        stream = await self.clients[tenant].chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": self._question(rng, tenant)}],
            max_tokens=MAX_TOKENS,
            stream=True,
        )
        finish = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        return "200", None if finish else "stream ended without a finish_reason"

    async def _structured(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        index = rng.randrange(len(SCHEMAS))
        reply = await self.clients[tenant].chat.completions.create(
            model="small",
            messages=[{"role": "user", "content": "Describe someone as JSON."}],
            max_tokens=48,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": f"s{index}", "schema": SCHEMAS[index]},
            },
        )
        choice = reply.choices[0]
        if choice.finish_reason == "length":
            return "200", None  # cut off by max_tokens: valid so far, unparseable
        try:
            json.loads(choice.message.content or "")
        except ValueError:
            return "200", "structured output is not JSON"
        return "200", None

    async def _tools(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        city = rng.choice(["Paris", "Lima", "Oslo", "Cairo"])
        question = f"What is the weather in {city}?"
        return await self._ask(tenant, question, model="large", tools=TOOLS)

    # --- other routes --------------------------------------------------------------------

    async def _completion(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        reply = await self.clients[tenant].completions.create(
            model="small", prompt=f"Once upon a time in {rng.randrange(50)} BC,", max_tokens=16
        )
        return "200", None if reply.choices[0].text is not None else "no text"

    async def _embeddings(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        inputs = rng.sample(FACTS, rng.randrange(24, 49))
        reply = await self.clients[tenant].embeddings.create(model="all-MiniLM-L6-v2", input=inputs)
        ok = len(reply.data) == len(inputs) and all(len(d.embedding) == 384 for d in reply.data)
        return "200", None if ok else "wrong number or size of vectors"

    # --- clients that leave, and bad requests -------------------------------------------

    async def _leave_stream(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        stream = await self.clients[tenant].chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": f"Count from {rng.randrange(100)} upwards."}],
            max_tokens=64,
            stream=True,
        )
        read = 0
        async for _ in stream:
            read += 1
            if read == 2:
                break
        await stream.close()
        return "client_left", None

    async def _leave_whole(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        question = f"Tell a story about the number {rng.randrange(100)}."
        try:
            async with asyncio.timeout(rng.uniform(0.05, 0.8)):
                await self._ask(tenant, question)
        except TimeoutError:
            return "client_left", None
        return "200", None  # answered before the client gave up

    async def _bad_body(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        return await self._raw(rng.choice(BAD_BODIES), self.keys[tenant], "400")

    async def _unknown_model(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
        return await self._raw(json.dumps(body).encode(), self.keys[tenant], "404")

    async def _bad_key(self, rng: random.Random, tenant: int) -> tuple[str, str | None]:
        body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        return await self._raw(json.dumps(body).encode(), "sk-not-a-key-000000", "401")

    async def _raw(self, body: bytes, key: str, expected: str) -> tuple[str, str | None]:
        response = await self.http.post(
            "/v1/chat/completions",
            content=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        status = str(response.status_code)
        if status != expected:
            return status, f"expected {expected}"
        try:
            error = response.json()["error"]
            ok = isinstance(error["message"], str) and "type" in error
        except (ValueError, KeyError, TypeError):
            ok = False
        return status, None if ok else "not an OpenAI error body"
