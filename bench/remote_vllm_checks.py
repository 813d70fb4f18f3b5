"""The checks and latency rounds of bench/remote_vllm.py, through the official openai client.

Each check returns {"pass": bool, ...what it saw}. A gateway answer counts as vLLM's only
when its x-tiergate-tier / x-tiergate-model headers say so: a tier that silently fell back
to the local engine would otherwise pass most checks (our engine honours salts too).
"""

import os
import signal
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

from bench import common
from gateway.backends.forward import tenant_cache_salt

SERVED = "smol"  # vLLM's --served-model-name
REMOTE_MODEL = f"hosted_vllm/{SERVED}"  # what x-tiergate-model says when vLLM answered
LOCAL = ("local", "smol-local")
VLLM_KEY = "sk-bench-vllm"
SALT_SECRET = "bench-remote-vllm-salt"
KEYS = {"team-a": "sk-bench-team-a", "team-b": "sk-bench-team-b"}
MAX_TOKENS = 16
# Greedy and exactly MAX_TOKENS long, so usage can be compared with vLLM's own count.
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": MAX_TOKENS}
GREEDY_EXTRA = {"ignore_eos": True}
QUESTIONS = [
    "Name three primary colors.",
    "What is the boiling point of water at sea level?",
    "Give one tip for writing clear emails.",
    "Why is the sky blue? Answer briefly.",
    "What does a compiler do?",
    "Suggest a name for a grey cat.",
    "How many legs does a spider have?",
    "What is a haiku?",
]


def gateway(url: str, tenant: str = "team-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=KEYS[tenant], max_retries=0, timeout=600)


def vllm(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=VLLM_KEY, max_retries=0, timeout=600)


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def served_by(headers: Any) -> tuple[str, str]:
    return headers.get("x-tiergate-tier", "?"), headers.get("x-tiergate-model", "?")


def usage_pair(usage: Any) -> tuple[int, int] | None:
    return (usage.prompt_tokens, usage.completion_tokens) if usage else None


def cached_tokens(usage: Any) -> int:
    details = getattr(usage, "prompt_tokens_details", None)
    return (getattr(details, "cached_tokens", 0) or 0) if details else 0


# ---------------------------------------------------------------- answers


def answer(vllm_url: str, gw_url: str, tier: str) -> dict[str, Any]:
    messages = chat(QUESTIONS[0])
    create = gateway(gw_url).chat.completions.with_raw_response.create
    raw = create(model=tier, messages=messages, extra_body=GREEDY_EXTRA, **GREEDY)
    reply = raw.parse()
    direct = vllm(vllm_url).chat.completions.create(
        model=SERVED, messages=messages, extra_body=GREEDY_EXTRA, **GREEDY
    )
    text = reply.choices[0].message.content or ""
    usage, expected = usage_pair(reply.usage), usage_pair(direct.usage)
    served = served_by(raw.headers)
    return {
        "pass": served == (tier, REMOTE_MODEL) and bool(text) and usage == expected,
        "served_by": served,
        "usage": usage,
        "vllm_usage": expected,
        "same_text_as_vllm": text == direct.choices[0].message.content,
    }


def stream(vllm_url: str, gw_url: str, tier: str) -> dict[str, Any]:
    messages = chat(QUESTIONS[1])
    create = gateway(gw_url).chat.completions.with_raw_response.create
    raw = create(
        model=tier,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=GREEDY_EXTRA,
        **GREEDY,
    )
    pieces, usage, finish = [], None, None
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        usage = chunk.usage or usage
    direct = vllm(vllm_url).chat.completions.create(
        model=SERVED, messages=messages, extra_body=GREEDY_EXTRA, **GREEDY
    )
    got, expected = usage_pair(usage), usage_pair(direct.usage)
    served = served_by(raw.headers)
    return {
        "pass": served == (tier, REMOTE_MODEL) and len(pieces) >= 2 and got == expected,
        "served_by": served,
        "pieces": len(pieces),
        "finish_reason": finish,
        "usage": got,
        "vllm_usage": expected,
        "same_text_as_vllm": "".join(pieces) == direct.choices[0].message.content,
    }


def completions(vllm_url: str, gw_url: str, tier: str) -> dict[str, Any]:
    prompt = "The three largest planets of the solar system are"
    create = gateway(gw_url).completions.with_raw_response.create
    raw = create(model=tier, prompt=prompt, extra_body=GREEDY_EXTRA, **GREEDY)
    reply = raw.parse()
    direct = vllm(vllm_url).completions.create(
        model=SERVED, prompt=prompt, extra_body=GREEDY_EXTRA, **GREEDY
    )
    usage, expected = usage_pair(reply.usage), usage_pair(direct.usage)
    served = served_by(raw.headers)
    return {
        "pass": served == (tier, REMOTE_MODEL)
        and bool(reply.choices[0].text)
        and usage == expected,
        "served_by": served,
        "usage": usage,
        "vllm_usage": expected,
        "same_text_as_vllm": reply.choices[0].text == direct.choices[0].text,
    }


# ---------------------------------------------------------------- the tenant's salt


def long_prompt() -> str:
    """~600 tokens no earlier request began with (vLLM's prefix cache keys on the start)."""
    from pydoc_data.topics import topics

    reference = "\n\n".join(topics[k] for k in sorted(topics))[:2400]
    return f"[{uuid.uuid4().hex}] Summarise this reference in one line:\n\n{reference}"


def cache_salt(vllm_url: str, gw_url: str, tier: str) -> dict[str, Any]:
    """Pages a tenant's request left in vLLM are found under exactly the gateway's salt."""
    messages = chat(long_prompt())
    seen: dict[str, Any] = {}

    def via_gateway(tenant: str) -> int:
        create = gateway(gw_url, tenant).chat.completions.with_raw_response.create
        raw = create(model=tier, messages=messages, temperature=0.0, max_tokens=1)
        usage = raw.parse().usage
        seen["prompt_tokens"] = usage.prompt_tokens
        seen.setdefault("served_by", set()).add(served_by(raw.headers))
        return cached_tokens(usage)

    def direct(salt: str | None) -> int:
        extra = {"cache_salt": salt} if salt else {}
        reply = vllm(vllm_url).chat.completions.create(
            model=SERVED, messages=messages, temperature=0.0, max_tokens=1, extra_body=extra
        )
        return cached_tokens(reply.usage)

    cached = {
        "team-a first": via_gateway("team-a"),
        "team-a again": via_gateway("team-a"),
        "team-b": via_gateway("team-b"),
        "vllm direct, team-a's salt": direct(tenant_cache_salt("team-a", SALT_SECRET)),
        "vllm direct, no salt": direct(None),
    }
    half = seen["prompt_tokens"] // 2
    found = {name: tokens >= half for name, tokens in cached.items()}
    expected = {name: name in ("team-a again", "vllm direct, team-a's salt") for name in cached}
    served = sorted(seen["served_by"])
    return {
        "pass": found == expected and served == [(tier, REMOTE_MODEL)],
        "prompt_tokens": seen["prompt_tokens"],
        "cached_tokens": cached,
        "prefix_found": found,
        "served_by": served,
    }


# ---------------------------------------------------------------- vLLM stopped mid-run


def fallback(gw_url: str, vllm_pid: int, tiers: list[str], total: int = 8) -> dict[str, Any]:
    """Two clients send `total` requests; vLLM is killed once two were answered by it."""
    killed, lock = threading.Event(), threading.Lock()
    rows: list[dict[str, Any]] = []
    state = {"started": 0}

    def one(i: int) -> None:
        with lock:
            state["started"] += 1
        row = {"request": i, "sent_after_kill": killed.is_set()}
        row |= _ask(gw_url, tiers[0], QUESTIONS[i % len(QUESTIONS)], stream=False)
        with lock:
            rows.append(row)

    with ThreadPoolExecutor(2) as pool:
        for i in range(total):
            pool.submit(one, i)
        deadline = time.monotonic() + 900
        while sum(r.get("served_by") == [tiers[0], REMOTE_MODEL] for r in rows) < 2:
            if time.monotonic() > deadline or len(rows) == total:
                break
            time.sleep(0.05)
        os.killpg(vllm_pid, signal.SIGKILL)  # its process group: the API server and EngineCore
        with lock:
            in_flight = state["started"] - len(rows)
        killed.set()
    after = [_ask(gw_url, t, QUESTIONS[0], stream=s) | {"tier": t} for t in tiers for s in (0, 1)]
    local = list(LOCAL)
    ok = all(r["status"] == 200 and r["text"] for r in rows + after)
    before_kill = [r for r in rows if r["served_by"] == [tiers[0], REMOTE_MODEL]]
    late = [r for r in rows if r["sent_after_kill"]] + after
    ok = ok and len(rows) == total
    return {
        "pass": ok and len(before_kill) >= 2 and all(r["served_by"] == local for r in late),
        "in_flight_at_kill": in_flight,
        "requests": sorted(rows, key=lambda r: r["request"]),
        "after_kill": after,
    }


def _ask(gw_url: str, tier: str, question: str, stream: bool) -> dict[str, Any]:
    create = gateway(gw_url).chat.completions.with_raw_response.create
    kwargs = {"stream": True} if stream else {}
    try:
        raw = create(
            model=tier, messages=chat(question), extra_body=GREEDY_EXTRA, **GREEDY, **kwargs
        )
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        else:
            text = raw.parse().choices[0].message.content or ""
    except openai.APIStatusError as exc:
        return {"status": exc.status_code, "error": exc.message, "text": False, "served_by": None}
    except openai.APIError as exc:
        return {"status": None, "error": str(exc), "text": False, "served_by": None}
    return {"status": 200, "text": bool(text), "served_by": list(served_by(raw.headers))}


# ---------------------------------------------------------------- latency


def latency(vllm_url: str, gw_url: str, tiers: list[str], rounds: int) -> dict[str, Any]:
    """Seconds to the whole answer and to the first streamed piece, targets in turn."""
    targets = {"vllm:direct": (vllm(vllm_url), SERVED)}
    targets |= {f"gateway:{t}": (gateway(gw_url), t) for t in tiers}
    samples: dict[str, dict[str, list]] = {
        n: {"total": [], "ttft": [], "tiers": []} for n in targets
    }
    for client, model in targets.values():  # warm: connections, litellm's first call
        _timed(client, model, QUESTIONS[0], stream=False)
    for r in range(rounds):
        question = QUESTIONS[r % len(QUESTIONS)]
        for name, (client, model) in targets.items():
            total, tier = _timed(client, model, question, stream=False)
            ttft, _ = _timed(client, model, question, stream=True)
            samples[name]["total"].append(total)
            samples[name]["ttft"].append(ttft)
            samples[name]["tiers"].append(tier)
    return {
        name: {
            "requests": rounds,
            "output_tokens": 2 * MAX_TOKENS,
            "p50_s": round(common.median(s["total"]), 4),
            "mean_s": round(statistics.fmean(s["total"]), 4),
            "ttft_p50_s": round(common.median(s["ttft"]), 4),
            "served_by_tiers": sorted(set(s["tiers"])),
        }
        for name, s in samples.items()
    }


def _timed(client: openai.OpenAI, model: str, question: str, stream: bool) -> tuple[float, str]:
    """Seconds to the whole answer (or to the first piece of a stream), the serving tier."""
    body = {"max_tokens": 2 * MAX_TOKENS, "temperature": 0.0, "extra_body": GREEDY_EXTRA}
    start = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=chat(question), stream=stream, **body
    )
    tier = raw.headers.get("x-tiergate-tier", "vllm")
    if not stream:
        raw.parse()
        return time.perf_counter() - start, tier
    first = None
    for chunk in raw.parse():
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
    return (first if first is not None else float("nan")), tier
