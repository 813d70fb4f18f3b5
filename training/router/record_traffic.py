"""Record the traffic file `tests/test_router_learn.py` replays (`python -m training router
record-traffic`): real prompts nobody here wrote (ShareGPT first turns, GSM8K test
questions), sent through a real gateway on the bundled tiers (SmolLM2-135M small,
Qwen2.5-Coder-0.5B large) with `learn.sample_rate: 1`, exported from /admin/router/samples,
then given the other tier's answer and the judge's verdict by `tiergate router learn`
(whose record is the file).
"""

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path

import httpx

from training.artifacts import DIFFICULTY_EXAMPLES, ROOT
from training.datasets import first_exchange, iter_sharegpt
from training.router.learn import main as learn_main
from training.router.tasks import gsm8k_path

OUT = ROOT / "tests" / "data" / "router_traffic.jsonl"
KEY, ADMIN = "sk-record-traffic", "sk-record-admin"
ENGINE = "{kv_cache_mb: 64, max_num_seqs: 8, max_model_len: 2048, num_threads: 1, weights: blocks}"
POLICY = """
auth: {{keys: [{{key: {key}, tenant: recorded}}], admin_key: {admin}}}
cache: {{enabled: false, path: '{store}'}}
engines: {{smollm2-135m: {engine}, qwen2.5-coder-0.5b: {engine}}}
tiers:
  small:
    deployments: [{{model: smollm2-135m}}]
    price: {{input: 0.02, output: 0.04}}
    timeout_s: 900  # one busy core: a long answer may take minutes
  large:
    deployments: [{{model: qwen2.5-coder-0.5b}}]
    price: {{input: 0.07, output: 0.15}}
    timeout_s: 900
difficulty:  # the shipped prior as router_policies/default.yaml has it
  examples: ['{examples}']
  blend: {{classifier: 1.0, kernel: 3.0}}
  regularization: 1.0
  kernel_width: 0.5
  kernel_ridge: 0.3
  kernel_lexical: 0.0
  kernel_centres: 1500
router_learning: {{max_tokens: 512}}  # the other tier's answer: as long as the request's
routes:
  auto:
    rules: [{{name: hard, tier: large, min_score: 0.633873}}]
    default: small
    learn: {{sample_rate: 1.0}}
"""


def real_prompts(chat: int, math: int) -> list[str]:
    """`chat` ShareGPT first turns of 15-400 plain characters, then `math` GSM8K questions
    from the end of the test split; none that the shipped examples hold."""
    prior = {json.loads(line)["prompt"] for line in DIFFICULTY_EXAMPLES.read_text().splitlines()}
    picked: list[str] = []
    for conv in iter_sharegpt(4000):
        first = first_exchange(conv)
        text = first[0].strip() if first else ""
        if 15 <= len(text) <= 400 and text.isascii() and text not in prior | set(picked):
            picked.append(text)
        if len(picked) == chat:
            break
    rows = [json.loads(line) for line in gsm8k_path().read_text().splitlines() if line.strip()]
    questions = [r["question"] for r in reversed(rows) if r["question"] not in prior]
    return picked + questions[:math]


def serve(policy_path: Path, port: int) -> tuple[threading.Thread, object]:
    import uvicorn

    from gateway.app import create_app
    from gateway.policy import load_policy

    app = create_app(load_policy(policy_path), policy_path=policy_path)
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.1)
    return thread, server


def record(
    bodies: list[dict], folder: Path, port: int, engine: str = ENGINE, concurrency: int = 1
) -> tuple[Path, Path]:
    """Send each chat body (`model: auto` added) through a gateway on the bundled tiers that
    samples every request, `concurrency` at a time; the policy and the exported samples."""
    policy = folder / "policy.yaml"
    store = folder / "store.sqlite3"
    text = POLICY.format(
        key=KEY, admin=ADMIN, store=store, engine=engine, examples=DIFFICULTY_EXAMPLES
    )
    policy.write_text(text)
    thread, server = serve(policy, port)
    base = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(_send_all(base, bodies, concurrency))
        time.sleep(1)  # the last sample is kept in the background
        export = httpx.get(
            f"{base}/admin/router/samples",
            params={"format": "jsonl"},
            headers={"authorization": f"Bearer {ADMIN}"},
        )
        export.raise_for_status()
    finally:
        server.should_exit = True
        thread.join(timeout=60)
    samples = folder / "samples.jsonl"
    samples.write_text(export.text)
    return policy, samples


async def _send_all(base: str, bodies: list[dict], concurrency: int) -> None:
    gate, done = asyncio.Semaphore(concurrency), [0]
    auth = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=base, headers=auth, timeout=1800) as client:

        async def send(body: dict) -> None:
            async with gate:
                answer = await client.post("/v1/chat/completions", json={"model": "auto"} | body)
            answer.raise_for_status()
            done[0] += 1
            print(f"{done[0]}/{len(bodies)} {answer.headers.get('x-tiergate-tier')}", flush=True)

        await asyncio.gather(*(send(b) for b in bodies))


def chat_bodies(prompts: list[str], max_tokens: int) -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": p}], "max_tokens": max_tokens, "temperature": 0}
        for p in prompts
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training router record-traffic")
    p.add_argument("--chat", type=int, default=28)
    p.add_argument("--math", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--port", type=int, default=8931)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="record-traffic-"))
    bodies = chat_bodies(real_prompts(args.chat, args.math), args.max_tokens)
    policy, samples = record(bodies, folder, args.port)
    examples = folder / "examples.jsonl"
    learn = ["--policy", str(policy), "--samples", str(samples), "--out", str(examples)]
    return learn_main([*learn, "--record", args.out, "--max-usd", "1"])
