"""llama-cpp-python baseline, run inside .bench-venvs/llamacpp (not the project venv).

Reads a JSON job {gguf, items: [{prompt_ids, output_tokens}], threads} from argv[1] and
serves the items one after another, as a Python user of llama-cpp-python would.
Prints one JSON line: output tokens, generation seconds, load seconds, threads used, and per
request its tokens, seconds and first-token seconds (streamed), for the single-stream figure.
"""

import json
import sys
import time
from pathlib import Path
from typing import Any


def load(gguf: str, n_ctx: int, threads: int) -> Any:
    from llama_cpp import Llama

    return Llama(model_path=gguf, n_ctx=n_ctx, n_threads=threads, n_batch=512, verbose=False)


def rate(llm: Any, prompt: list[int], tokens: int) -> float:
    llm.reset()
    start = time.perf_counter()
    out = llm.create_completion(
        prompt=prompt, max_tokens=tokens, temperature=0.0, logit_bias={llm.token_eos(): -1e9}
    )
    return out["usage"]["completion_tokens"] / (time.perf_counter() - start)


def best_threads(gguf: str, n_ctx: int, prompt: list[int], most: int) -> tuple[int, dict]:
    """llama.cpp's OpenMP threads spin; on a busy machine fewer threads can be much faster.

    Give the baseline its best setting: a short probe at 1..most threads, keep the fastest.
    """
    rates = {}
    for threads in range(1, most + 1):
        llm = load(gguf, n_ctx, threads)
        rate(llm, prompt, 4)  # warm-up
        rates[threads] = round(rate(llm, prompt, 32), 1)
        del llm
    return max(rates, key=rates.__getitem__), rates


def timed_request(llm: Any, item: dict, no_eos: dict) -> dict[str, float]:
    """One request, streamed: the first chunk's time splits prefill from decode."""
    start = time.perf_counter()
    first = None
    for _chunk in llm.create_completion(
        prompt=item["prompt_ids"],
        max_tokens=item["output_tokens"],
        temperature=0.0,
        logit_bias=no_eos,
        stream=True,
    ):
        first = first if first is not None else time.perf_counter() - start
    # EOS barred: exactly max_tokens (a stream chunk can hold back part of a UTF-8 character,
    # so chunks are not a token count)
    return {
        "tokens": item["output_tokens"],
        "seconds": time.perf_counter() - start,
        "first_s": first or 0.0,
    }


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    items = job["items"]
    n_ctx = max(len(i["prompt_ids"]) + i["output_tokens"] for i in items) + 16
    threads, probe = best_threads(job["gguf"], n_ctx, items[0]["prompt_ids"], job["threads"])
    start = time.perf_counter()
    llm = load(job["gguf"], n_ctx, threads)
    load_seconds = time.perf_counter() - start
    # EOS barred so every engine generates exactly the requested number of tokens.
    no_eos = {llm.token_eos(): -1e9}
    llm.create_completion(prompt=items[0]["prompt_ids"], max_tokens=4, temperature=0.0)  # warm-up
    per_request = []
    start = time.perf_counter()
    for item in items:
        llm.reset()  # no KV reuse between unrelated requests
        per_request.append(timed_request(llm, item, no_eos))
    seconds = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in per_request)
    result = {
        "output_tokens": tokens,
        "seconds": seconds,
        "load_seconds": load_seconds,
        "threads": threads,
        "thread_probe_tokens_per_s": probe,
        "per_request": per_request,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
