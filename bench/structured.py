"""What constrained decoding costs and buys, on the real SmolLM2 in one run:

1. Throughput: the same batch decoding the same number of tokens with a JSON schema
   enforced (llguidance bitmasks on the batched logits) and without. The schema needs more
   tokens than max_tokens allows (an array of at least 40 items) and the plain requests
   ignore EOS, so both runs decode exactly batch x max_tokens tokens and only the cost of
   the masks differs. Runs alternate (ABBA); the figure is the median ratio (goal >= 0.9), and
   the share of the constrained runs' time spent in the grammar's own work (masks,
   matcher advances), which a busy machine does not blur.
2. Validity: the same prompts asking for JSON, answered with the schema enforced and
   without (what the model does alone): the share whose whole answer parses and validates
   (goal with the schema: 1.0), and, without it, also the share with a valid object
   somewhere in the text (a fenced block, say).

    python -m bench.structured [--quick]
"""

import argparse
import json
import re
import time
from typing import Any

import jsonschema
import torch

from bench import common
from bench.common import cpu_model
from engine import runner
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.structured_output import grammar
from engine.structured_output.constraints import JsonConstraint, SchemaSource

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
INVENTORY = {  # longer than any max_tokens here: the constrained runs never end early
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 40,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["name", "qty"],
            },
        }
    },
    "required": ["items"],
}
ASK = (
    "Invent person number {i}: a name, an age and a city (Paris, Rome or Oslo). "
    'Answer with JSON only, like {{"name": "...", "age": 0, "city": "..."}}.'
)
_OBJECT = re.compile(r"\{.*?\}", re.DOTALL)


def constraint(schema: dict) -> JsonConstraint:
    return JsonConstraint(SchemaSource(json.dumps(schema), "response_format.json_schema.schema"))


def prompts(engine: LLMEngine, n: int) -> list[str]:
    render = engine.tokenizer.apply_chat_template
    return [render([{"role": "user", "content": ASK.format(i=i)}]) for i in range(n)]


class GrammarClock:
    """Seconds spent in the grammar's own work: masks in the runner, matcher advances."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Any) -> Any:
        def timed(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - started

        return timed


def watch_grammar() -> GrammarClock:
    clock = GrammarClock()
    runner.mask_logits = clock.wrap(runner.mask_logits)
    grammar.GrammarState.accept = clock.wrap(grammar.GrammarState.accept)
    return clock


def tokens_per_s(engine: LLMEngine, batch: list[str], params: SamplingParams) -> float:
    engine.reset_prefix_cache()
    started = time.perf_counter()
    engine.generate(batch, [params] * len(batch))
    return len(batch) * params.max_tokens / (time.perf_counter() - started)


def valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), PERSON)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def validity(engine: LLMEngine, batch: list[str], tokens: int) -> dict[str, float]:
    def params(i: int, constrained: bool) -> SamplingParams:
        c = constraint(PERSON) if constrained else None
        return SamplingParams(temperature=0.8, seed=i, max_tokens=tokens, constraint=c)

    with_schema = engine.generate(batch, [params(i, True) for i in range(len(batch))])
    alone = engine.generate(batch, [params(i, False) for i in range(len(batch))])
    somewhere = [any(valid(m) for m in _OBJECT.findall(t)) for t in alone]
    return {
        "with_schema": sum(map(valid, with_schema)) / len(batch),
        "without_schema": sum(map(valid, alone)) / len(batch),
        "without_schema_object_somewhere": sum(somewhere) / len(batch),
    }


def compile_ms(engine: LLMEngine) -> dict[str, float]:
    schema = {**PERSON, "title": "fresh"}  # not compiled before
    times = []
    for _ in range(2):
        started = time.perf_counter()
        engine.grammars.state_for(constraint(schema))
        times.append(round((time.perf_counter() - started) * 1000, 2))
    return {"first": times[0], "cached": times[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    batch, tokens, rounds, n_valid = (4, 24, 2, 8) if args.quick else (8, 48, 4, 16)
    torch.set_num_threads(1)
    config = EngineConfig(model=common.MODEL, kv_cache_bytes=64 << 20, max_num_seqs=batch)
    engine = LLMEngine(config)
    work = prompts(engine, batch)
    plain = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    schema = SamplingParams(temperature=0, max_tokens=tokens, constraint=constraint(INVENTORY))
    tokens_per_s(engine, work, schema)  # warm-up: kernels, pages, the tokenizer's trie
    clock = watch_grammar()
    runs: dict[str, list[float]] = {"plain": [], "schema": []}
    schema_seconds = 0.0
    for r in range(rounds):
        order = ["plain", "schema"] if r % 2 == 0 else ["schema", "plain"]  # ABBA: no order bias
        for name in order:
            started = time.perf_counter()
            runs[name].append(tokens_per_s(engine, work, plain if name == "plain" else schema))
            if name == "schema":
                schema_seconds += time.perf_counter() - started
    grammar_share = round(clock.seconds / schema_seconds, 4)
    ratio = round(
        common.median([s / p for s, p in zip(runs["schema"], runs["plain"], strict=True)]), 3
    )
    shares = validity(engine, prompts(engine, n_valid), 64)
    result = {
        "cpu_model": cpu_model(),
        "model": common.MODEL,
        "batch": batch,
        "output_tokens": tokens,
        "tokens_per_s": {k: [round(v, 1) for v in vs] for k, vs in runs.items()},
        "schema_vs_plain": ratio,
        # robust to the machine's load, which moves both runs' tokens/s by more than 10%
        "grammar_share_of_schema_run": grammar_share,
        "valid_share": shares,
        "valid_requests": n_valid,
        "compile_ms": compile_ms(engine),
        "goals": {
            "schema_vs_plain": common.goal(ratio, 0.9),
            "valid_with_schema": common.goal(shares["with_schema"], 1.0),
        },
    }
    print(json.dumps(result, indent=2))
    common.write_result("structured", result)


if __name__ == "__main__":
    main()
