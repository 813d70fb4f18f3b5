"""Greedy chat answers of each weight format against our fp32 path, and against llama.cpp.

Is a format's divergence from fp32 ours, or what any engine with int8 activations does on
the same GGUF? llama.cpp multiplies Q4_1 / Q8_0 weights by activations quantized to
Q8_1 / Q8_0 per 32 values: the arithmetic of our `blocks`. So, per bundled model, one run:
our fp32 (the reference: the GGUF's weights dequantized, fp32 activations), bf16, w8a8 and
blocks, and llama-cpp-python on the same GGUF in its own precision, all greedy from the
same chat-template token ids, one thread, `--max-tokens` each, an answer ending at EOS.

Per engine against fp32 (and blocks / w8a8 against llama.cpp): answers identical, the
median first differing token of the answers that differ, and token agreement (positions
with the same token over the longer answer's length, summed over prompts). Each answer's
text is kept in the JSON for judging the changed ones by hand, and the factual ones are
scored by their right answer's words (FACTS).

CPU time on a shared 2-core AMD EPYC, one thread: SmolLM2 ~1.5-2.5 min, Qwen ~10 min (most
of it teacher-forced prefills over a 151k vocabulary, and llama.cpp's); `--models` picks.
"""

import argparse
import json
import re
import statistics
from typing import Any

from bench import common, precision, venv_baselines
from bench import engine_driver as ed

MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b")
FORMATS = ("fp32", "bf16", "w8a8", "blocks")
LLAMA = "llamacpp"
# short chat questions, many with one right answer, so a changed answer can be judged
PROMPTS = [
    "What is the capital of France?",
    "What is the capital of Japan?",
    "What is the capital of Italy?",
    "How many days are in a week?",
    "How many legs does a spider have?",
    "What is 7 times 8?",
    "What is the boiling point of water in Celsius?",
    "Who wrote Romeo and Juliet?",
    "What color is the sky on a clear day?",
    "What is the largest planet in the solar system?",
    "What is the chemical symbol for gold?",
    "What language is spoken in Brazil?",
    "How many continents are there?",
    "What is the opposite of hot?",
    "Name a primary color.",
    "What is the square root of 81?",
    "Which animal is known as the king of the jungle?",
    "What gas do plants absorb from the air?",
    "What is the freezing point of water in Fahrenheit?",
    "Who painted the Mona Lisa?",
    "Give me a synonym for happy.",
    "Translate 'thank you' into Spanish.",
    "What is the plural of mouse?",
    "Write a Python function that returns the sum of a list.",
    "How do I reverse a string in Python?",
    "What does HTML stand for?",
    "What is a prime number?",
    "Explain what a black hole is in one sentence.",
    "Give me three tips for better sleep.",
    "Write a haiku about the sea.",
    "What is the difference between a list and a tuple in Python?",
    "Why do leaves change color in autumn?",
    "Suggest a name for a pet cat.",
    "What is machine learning?",
    "How many hours are in a day?",
    "What is the tallest mountain on Earth?",
]

# the right answer's words (regex, case-insensitive) for the factual ones: a changed answer
# that loses them got worse, one that gains them got better; the rest are judged by eye
FACTS = {
    "What is the capital of France?": r"\bparis\b",
    "What is the capital of Japan?": r"\btokyo\b",
    "What is the capital of Italy?": r"\brome\b",
    "How many days are in a week?": r"\b(7|seven)\b",
    "How many legs does a spider have?": r"\b(8|eight)\b",
    "What is 7 times 8?": r"\b56\b",
    "What is the boiling point of water in Celsius?": r"\b100\b",
    "Who wrote Romeo and Juliet?": r"shakespeare",
    "What color is the sky on a clear day?": r"\bblue\b",
    "What is the largest planet in the solar system?": r"\bjupiter\b",
    "What is the chemical symbol for gold?": r"\bau\b",
    "What language is spoken in Brazil?": r"\bportuguese\b",
    "How many continents are there?": r"\b(7|seven)\b",
    "What is the opposite of hot?": r"\bcold\b",
    "Name a primary color.": r"\b(red|blue|yellow)\b",
    "What is the square root of 81?": r"\b(9|nine)\b",
    "Which animal is known as the king of the jungle?": r"\blions?\b",
    "What gas do plants absorb from the air?": r"carbon dioxide|\bco2\b",
    "What is the freezing point of water in Fahrenheit?": r"\b32\b",
    "Who painted the Mona Lisa?": r"leonardo|da vinci",
    "Translate 'thank you' into Spanish.": r"gracias",
    "What is the plural of mouse?": r"\bmice\b",
    "What does HTML stand for?": r"hypertext markup language",
    "How many hours are in a day?": r"\b24\b",
    "What is the tallest mountain on Earth?": r"\beverest\b",
}


def fact_scores(texts: list[dict[str, str]], engines: list[str]) -> dict[str, Any]:
    """Per engine: factual answers holding the right words; against fp32, how many of the
    factual answers that changed lost them (worse) or gained them (better)."""
    facts = [t for t in texts if t["prompt"] in FACTS]
    right = {
        e: {t["prompt"]: bool(re.search(FACTS[t["prompt"]], t[e], re.I)) for t in facts}
        for e in engines
    }
    out: dict[str, Any] = {}
    for e in engines:
        changed = [t["prompt"] for t in facts if t[e] != t["fp32"]]
        out[e] = {
            "right": f"{sum(right[e].values())}/{len(FACTS)}",
            "changed_vs_fp32": len(changed),
            "lost_right_answer": [q for q in changed if right["fp32"][q] and not right[e][q]],
            "gained_right_answer": [q for q in changed if right[e][q] and not right["fp32"][q]],
        }
    return out


def chat_ids(tokenizer: Any, question: str) -> list[int]:
    """The ids our servers feed for a one-message chat (template rendered, then encoded)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}])
    return tokenizer.encode(text)


def until_stop(ids: list[int], stop: set[int]) -> list[int]:
    """An answer up to and including its first stop id (greedy ran past it)."""
    for i, t in enumerate(ids):
        if t in stop:
            return ids[: i + 1]
    return ids


def build(model: str, weights: str) -> Any:
    return ed.make_engine(model=model, weights=weights, kv_cache_bytes=256 << 20, num_threads=1)


def greedy_answers(engine: Any, prompts: list[list[int]], n: int, stop: set[int]) -> Any:
    return [until_stop(t, stop) for t in precision.greedy_tokens(engine, prompts, n)]


def forced_top1(engine: Any, seqs: list[list[int]]) -> list[list[int]]:
    """Each sequence's argmax after each position but the last (what predicts the next
    token), the whole sequence in one prefill."""
    return forced_pass(engine, seqs)[0]


def forced_pass(engine: Any, seqs: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
    """forced_top1, and each position's gap between its two largest logits."""
    top1, margins = [], []
    for seq in seqs:
        top2 = precision.prefill_logits(engine.runner, seq[:-1]).topk(2, -1)
        top1.append(top2.indices[:, 0].tolist())
        margins.append((top2.values[:, 0] - top2.values[:, 1]).tolist())
    return top1, margins


def llamacpp(model: str, prompts: list[list[int]], n: int, stop: set[int], forced: Any) -> Any:
    venv = common.ensure_venv(LLAMA)
    if venv.python is None:
        return {"skipped": venv.skipped}
    from engine.model_registry import resolve_model

    job = {
        "gguf": str(resolve_model(model).path),
        "prompts": prompts,
        "max_tokens": n,
        "stop_ids": sorted(stop),
        "threads": 1,
        "forced": forced,
    }
    result = venv_baselines.run_in_venv(venv, "greedy_llamacpp.py", job, timeout=1200)
    if "skipped" in result:
        return result
    result["answers"] = [until_stop(a, stop) for a in result["answers"]]
    return result


def agreement(answers: list[list[int]], ref: list[list[int]]) -> dict[str, Any]:
    pairs = list(zip(answers, ref, strict=True))
    differ = [precision.common_prefix(a, b) for a, b in pairs if a != b]
    same_tokens = sum(sum(x == y for x, y in zip(a, b, strict=False)) for a, b in pairs)
    positions = sum(max(len(a), len(b)) for a, b in pairs)
    return {
        "identical": f"{len(pairs) - len(differ)}/{len(pairs)}",
        "identical_fraction": round((len(pairs) - len(differ)) / len(pairs), 3),
        "median_first_diff_token": statistics.median(differ) if differ else None,
        "token_agreement": round(same_tokens / positions, 3),
    }


def forced_agreement(top1: list[list[int]], ref: list[list[int]], starts: list[int]) -> float:
    """Share of answer positions (after the prompt) where both pick the same next token."""
    pairs = [(a[s:], b[s:]) for a, b, s in zip(top1, ref, starts, strict=True)]
    same = sum(sum(x == y for x, y in zip(a, b, strict=True)) for a, b in pairs)
    return round(same / sum(len(a) for a, _ in pairs), 4)


def margins_at_flips(
    top1: list[list[int]], ref: list[list[int]], margins: list[list[float]], starts: list[int]
) -> dict[str, Any]:
    """fp32's top-2 logit gap where the two argmaxes differ: a flip at a near tie is a coin
    fp32 itself could have tossed the other way."""
    flips = [
        m[i]
        for a, b, m, s in zip(top1, ref, margins, starts, strict=True)
        for i in range(s, len(a))
        if a[i] != b[i]
    ]
    if not flips:
        return {"flips": 0}
    return {
        "flips": len(flips),
        "fp32_margin_at_flips_median": round(statistics.median(flips), 3),
        "fp32_margin_at_flips_max": round(max(flips), 3),
    }


def run_model(model: str, n: int) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    forced: dict[str, Any] = {}
    gaps: dict[str, Any] = {}
    for weights in FORMATS:
        engine = build(model, weights)
        if weights == "fp32":  # the reference: its ids, its answers, the forced sequences
            tok = engine.tokenizer
            stop = set(tok.eos_token_ids)
            prompts = [chat_ids(tok, q) for q in PROMPTS]
        answers[weights] = greedy_answers(engine, prompts, n, stop)
        seqs = [p + a for p, a in zip(prompts, answers["fp32"], strict=True)]
        forced[weights], gaps[weights] = forced_pass(engine, seqs)
        del engine
        print(f"[{model}] {weights} done", flush=True)
    llama = llamacpp(model, prompts, n, stop, seqs)
    print(f"[{model}] llama.cpp done", flush=True)
    starts = [len(p) - 1 for p in prompts]  # top1[i] predicts token i + 1
    margins = gaps["fp32"]
    compare = {}
    for w in FORMATS[1:]:
        compare[w] = agreement(answers[w], answers["fp32"])
        compare[w]["forced_top1_agreement"] = forced_agreement(forced[w], forced["fp32"], starts)
        compare[w] |= margins_at_flips(forced[w], forced["fp32"], margins, starts)
    if "skipped" in llama:
        compare[LLAMA] = llama
    else:
        answers[LLAMA], forced[LLAMA] = llama["answers"], llama["forced_top1"]
        pairs = {"llamacpp_vs_fp32": ("fp32", LLAMA), "blocks_vs_llamacpp": (LLAMA, "blocks")}
        pairs["w8a8_vs_llamacpp"] = (LLAMA, "w8a8")
        for name, (ref, other) in pairs.items():
            compare[name] = agreement(answers[other], answers[ref]) | {
                "forced_top1_agreement": forced_agreement(forced[other], forced[ref], starts)
            }
        compare["llamacpp_vs_fp32"] |= margins_at_flips(
            forced[LLAMA], forced["fp32"], margins, starts
        )
    # our prefill and decode paths agree with each other: fp32's forced argmax is its answer
    fp32_self = forced_agreement(forced["fp32"], [s[1:] for s in seqs], starts)
    texts = [
        {"prompt": q} | {e: tok.decode(a[i]) for e, a in answers.items()}
        for i, q in enumerate(PROMPTS)
    ]
    return {
        "agreement": compare,
        "fp32_forced_vs_own_answers": fp32_self,
        "fp32_margin_median": round(
            statistics.median(x for m, s in zip(margins, starts, strict=True) for x in m[s:]), 3
        ),
        "facts": fact_scores(texts, list(answers)),
        "answers": texts,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--result", default="greedy_agreement")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    payload: dict[str, Any] = {
        "cpu": common.cpu_model(),
        "threads": 1,
        "max_tokens": args.max_tokens,
        "prompts": len(PROMPTS),
        "reference": "our fp32 path on the GGUF's weights",
        "models": {},
    }
    for model in args.models.split(","):
        payload["models"][model] = run_model(model, args.max_tokens)
        print(json.dumps({model: payload["models"][model]["agreement"]}, indent=2), flush=True)
    common.write_result(args.result, payload)


if __name__ == "__main__":
    main()
