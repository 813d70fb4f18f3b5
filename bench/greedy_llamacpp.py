"""llama-cpp-python greedy answers, run inside .bench-venvs/llamacpp (not the project venv).

Reads a JSON job {gguf, prompts: [[token ids]], max_tokens, stop_ids, threads, forced:
[[token ids]]} from argv[1]; per prompt, the greedy token ids llama.cpp picks in its own
arithmetic (quantized weights times activations quantized per block, f16 KV), stopping
after a stop id or max_tokens; per forced sequence, its argmax after each position
(teacher-forced: the whole sequence evaluated at once, every position's logits kept).
The ids go in as they are (no BOS added, no template applied): the caller's chat ids.
Prints 'RESULT {json}': the answers, forced argmaxes, output tokens, generation seconds.
"""

import json
import sys
import time
from pathlib import Path


def teacher_forced(job: dict, n_ctx: int) -> list[list[int]]:
    from llama_cpp import Llama

    forced = job.get("forced") or []
    if not forced:
        return []
    llm = Llama(
        model_path=job["gguf"],
        n_ctx=n_ctx,
        n_threads=job["threads"],
        n_batch=512,
        logits_all=True,
        verbose=False,
    )
    out = []
    for seq in forced:
        llm.reset()
        llm.eval(seq)
        out.append(llm.scores[: len(seq) - 1].argmax(-1).tolist())
    return out


def main() -> None:
    from llama_cpp import Llama

    job = json.loads(Path(sys.argv[1]).read_text())
    n_ctx = max(len(p) for p in job["prompts"]) + job["max_tokens"] + 16
    llm = Llama(
        model_path=job["gguf"], n_ctx=n_ctx, n_threads=job["threads"], n_batch=512, verbose=False
    )
    forced_top1 = teacher_forced(job, n_ctx)
    stop = set(job["stop_ids"])
    answers = []
    start = time.perf_counter()
    for prompt in job["prompts"]:
        llm.reset()  # no KV reuse between prompts
        out: list[int] = []
        # top_k 1 with temp 0: argmax; penalties and min_p off so nothing reorders the logits
        for token in llm.generate(
            prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0
        ):
            out.append(int(token))
            if token in stop or len(out) >= job["max_tokens"]:
                break
        answers.append(out)
    seconds = time.perf_counter() - start
    result = {
        "answers": answers,
        "forced_top1": forced_top1,
        "output_tokens": sum(len(a) for a in answers),
        "seconds": seconds,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
