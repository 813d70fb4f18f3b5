"""llama-cpp-python baseline, run inside .bench-venvs/llamacpp (not the project venv).

Reads a JSON job {gguf, items: [{prompt_ids, output_tokens}], threads} from argv[1] and
serves the items one after another, as a Python user of llama-cpp-python would.
Prints one JSON line: output tokens, generation seconds, load seconds.
"""

import json
import sys
import time
from pathlib import Path


def main() -> None:
    from llama_cpp import Llama

    job = json.loads(Path(sys.argv[1]).read_text())
    items = job["items"]
    n_ctx = max(len(i["prompt_ids"]) + i["output_tokens"] for i in items) + 16
    start = time.perf_counter()
    llm = Llama(
        model_path=job["gguf"],
        n_ctx=n_ctx,
        n_threads=job["threads"],
        n_batch=512,
        verbose=False,
    )
    load_seconds = time.perf_counter() - start
    # EOS barred so every engine generates exactly the requested number of tokens.
    no_eos = {llm.token_eos(): -1e9}
    llm.create_completion(prompt=items[0]["prompt_ids"], max_tokens=4, temperature=0.0)  # warm-up
    tokens = 0
    start = time.perf_counter()
    for item in items:
        llm.reset()  # no KV reuse between unrelated requests
        out = llm.create_completion(
            prompt=item["prompt_ids"],
            max_tokens=item["output_tokens"],
            temperature=0.0,
            logit_bias=no_eos,
        )
        tokens += out["usage"]["completion_tokens"]
    seconds = time.perf_counter() - start
    result = {"output_tokens": tokens, "seconds": seconds, "load_seconds": load_seconds}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
