"""vLLM (CPU build) baseline, run inside .bench-venvs/vllm (not the project venv).

Reads a JSON job {hf_folder, items: [{prompt_ids, output_tokens}], kv_gib, threads,
repeats, dtype} from argv[1], submits all items at once (vLLM batches them continuously),
`repeats` times, each after emptying the prefix cache and one warm-up request, and
prints one JSON line on stdout: output tokens, each run's seconds, start-up seconds.
"""

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    # vLLM's CPU backend sizes its KV cache from this variable (GiB), not from a fraction.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(job["kv_gib"]))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{job['threads'] - 1}")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    items = job["items"]
    max_len = max(len(i["prompt_ids"]) + i["output_tokens"] for i in items) + 16
    start = time.perf_counter()
    dtype = job.get("dtype", "float32")  # bfloat16: vLLM's recommended dtype on CPUs with bf16
    llm = LLM(model=job["hf_folder"], dtype=dtype, max_model_len=max_len, seed=0)
    startup_seconds = time.perf_counter() - start
    warm = SamplingParams(max_tokens=4, temperature=0.0)
    warm_prompt = [TokensPrompt(prompt_token_ids=items[0]["prompt_ids"])]
    prompts = [TokensPrompt(prompt_token_ids=i["prompt_ids"]) for i in items]
    params = [
        SamplingParams(max_tokens=i["output_tokens"], temperature=0.0, ignore_eos=True)
        for i in items
    ]
    runs = []
    for _ in range(job.get("repeats", 1)):
        # each run as the first: cache emptied, then the same warm-up request our engine
        # gets (its prompt's pages stay cached for the timed run, in both engines)
        llm.reset_prefix_cache()
        llm.generate(warm_prompt, warm, use_tqdm=False)
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        runs.append(time.perf_counter() - start)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    result = {"output_tokens": tokens, "runs_seconds": runs, "startup_seconds": startup_seconds}
    result["dtype"] = dtype
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
