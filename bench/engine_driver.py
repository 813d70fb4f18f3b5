"""Drive our LLMEngine the same way in every benchmark: build it, feed token ids, step, count.

Everything goes through the engine's public API (add_request / step / has_unfinished);
kv_slot_usage() alone reads scheduler internals, because LLMEngine has no per-step figure
of live tokens vs allocated KV slots (see bench/README.md).
"""

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import MODEL, ChatItem, engine_available  # noqa: F401  (re-exported)
from bench.hf_folder import ensure_hf_folder
from engine.models.config import hf_config


@dataclass(frozen=True)
class ModelDims:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 4  # K and V, fp32

    @property
    def matmul_params(self) -> int:
        """Weights a token multiplies through: projections, MLP and the LM head."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (q_o + k_v + mlp) + self.vocab * self.hidden

    def flops_per_token(self, context: float) -> float:
        """Matmul FLOPs of one decode token at the given context (scores + weighted sum)."""
        attention = 4 * self.layers * self.heads * self.head_dim * context
        return 2 * self.matmul_params + attention


def model_dims(model: str = MODEL) -> ModelDims:
    config = hf_config(ensure_hf_folder(model))  # the engine's own reading of config.json
    return ModelDims(
        layers=config.num_layers,
        hidden=config.hidden_size,
        heads=config.num_heads,
        kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        intermediate=config.intermediate_size,
        vocab=config.vocab_size,
    )


def make_engine(**config: Any) -> Any:
    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    return LLMEngine(EngineConfig(model=config.pop("model", MODEL), **config))


def greedy(max_tokens: int) -> Any:
    """Greedy, EOS ignored: every engine generates exactly the requested tokens."""
    from engine.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@dataclass
class RunStats:
    requests: int
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    seconds: float
    steps: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def computed_prefill_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


StepHook = Callable[[Any, list[Any]], None]


def run_requests(
    engine: Any,
    prompts: Sequence[list[int]],
    max_tokens: Sequence[int],
    on_step: StepHook | None = None,
    prefix: str = "r",
) -> RunStats:
    """Submit all prompts at once, step until every request finishes, count what came back."""
    start = time.perf_counter()
    for i, (ids, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        engine.add_request(f"{prefix}{i}", list(ids), greedy(n))
    outputs: dict[str, Any] = {}
    steps = 0
    step_limit = 10 * (sum(max_tokens) + sum(map(len, prompts)))  # bounded even if it stalls
    while engine.has_unfinished():
        if steps >= step_limit:
            raise RuntimeError(f"engine still busy after {steps} steps")
        step_outputs = engine.step()
        steps += 1
        for out in step_outputs:
            outputs[out.request_id] = out  # the last one carries the totals
        if on_step:
            on_step(engine, step_outputs)
        if steps % 50 == 0:  # a sign of life on long runs
            done = sum(o.finished for o in outputs.values())
            print(f"  step {steps}: {done}/{len(prompts)} done", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    done = list(outputs.values())
    return RunStats(
        requests=len(done),
        output_tokens=sum(o.completion_tokens for o in done),
        prompt_tokens=sum(o.prompt_tokens for o in done),
        cached_tokens=sum(o.cached_tokens for o in done),
        seconds=seconds,
        steps=steps,
    )


def run_chat_items(engine: Any, items: Sequence[ChatItem], prefix: str = "r") -> RunStats:
    return run_requests(
        engine, [i.prompt_ids for i in items], [i.output_tokens for i in items], prefix=prefix
    )


def warm_up(engine: Any, prompt_ids: list[int]) -> None:
    """One short request first: thread pools and lazy allocations stay out of the timing."""
    run_requests(engine, [prompt_ids], [4], prefix="warm")


def decode_rate(engine: Any, prompts: Sequence[list[int]], timed_steps: int) -> dict[str, float]:
    """Output tokens/s of decode-only steps with len(prompts) sequences running together.

    Prefill runs first (untimed); then `timed_steps` steps in which every sequence decodes one
    token are timed. Returns the rate and the mean context length during the timed steps.
    """
    batch = len(prompts)
    settle = 2  # a couple of decode steps after prefill before timing
    total = settle + timed_steps + 4  # enough tokens that nobody finishes inside the window
    for i, ids in enumerate(prompts):
        engine.add_request(f"d{i}", list(ids), greedy(total))
    emitted: dict[str, int] = {}
    for _ in range(100 * batch):  # prefill takes a few steps; the bound only stops a stall
        if len(emitted) == batch and min(emitted.values()) >= 1 + settle:
            break
        for out in engine.step():
            emitted[out.request_id] = out.completion_tokens
    context_start = sum(len(p) for p in prompts) / batch + min(emitted.values())
    tokens = 0
    step_seconds: list[float] = []
    for _ in range(timed_steps):
        start = time.perf_counter()
        tokens += sum(len(out.token_ids) for out in engine.step())
        step_seconds.append(time.perf_counter() - start)
    for _ in range(10 * total):
        if not engine.has_unfinished():
            break
        engine.step()
    return decode_summary(batch, tokens, step_seconds, context_start + timed_steps / 2)


def decode_summary(
    batch: int, tokens: int, step_seconds: list[float], mean_context: float
) -> dict[str, float]:
    """Rate from the median step: one step slowed by a neighbour's burst does not count."""
    median_step = sorted(step_seconds)[len(step_seconds) // 2]
    return {
        "batch": batch,
        "tokens": tokens,
        "seconds": sum(step_seconds),
        "mean_tokens_per_s": tokens / sum(step_seconds),
        "median_step_s": median_step,
        "tokens_per_s": tokens / len(step_seconds) / median_step,
        "mean_context": mean_context,
    }


def kv_slot_usage(engine: Any) -> tuple[int, int]:
    """(live token slots, allocated slots) over the pages running sequences hold now.

    A shared prefix page counts once. Only the last page of a sequence should be part full.
    """
    scheduler = engine.scheduler
    page_size = scheduler.kv.page_size
    filled: dict[int, int] = {}
    for seq in scheduler.running:
        computed = seq.num_computed_tokens
        for j, page in enumerate(scheduler.kv.page_table(seq)):
            live = max(0, min(page_size, computed - j * page_size))
            filled[page] = max(filled.get(page, 0), live)
    return sum(filled.values()), len(filled) * page_size
