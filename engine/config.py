"""Engine settings: one plain data class, filled from the CLI or the gateway policy."""

from dataclasses import dataclass

WEIGHT_FORMATS = ("fp32", "bf16", "int8", "w8a8", "blocks", "auto")  # EngineConfig.weights
KV_DTYPES = ("fp32", "bf16", "int8")  # EngineConfig.kv_dtype


@dataclass
class EngineConfig:
    model: str  # bundled name (smollm2-135m, ...), a GGUF path or a Hugging Face folder
    kv_cache_bytes: int = 256 * 1024 * 1024  # K and V pools of all layers together
    page_size: int = 16  # tokens per KV page
    max_num_seqs: int = 64  # running sequences per step
    max_num_batched_tokens: int = 2048  # token budget per step (prefill chunks + decodes)
    max_waiting: int = 256  # waiting-queue bound; beyond it add_request raises QueueFullError
    # One tenant's (cache salt's) share of the waiting queue, so one cannot fill it; None: all.
    max_waiting_per_tenant: int | None = None
    max_model_len: int | None = None  # None: the model's context length
    enable_prefix_caching: bool = True
    # Admission reserve (engine/scheduler.py): a waiting request is admitted only if the
    # pages left free after it cover kv_reserve_tokens more tokens of every running request
    # plus kv_watermark (a fraction) of the pool, so running requests grow without being
    # preempted. Both 0: admit whenever the prompt fits (preemption by recompute instead).
    kv_watermark: float = 0.02
    kv_reserve_tokens: int = 64
    # torch intra-op threads; None: one thread or all cores, whichever runs a few decode
    # steps faster at start (engine/thread_choice.py)
    num_threads: int | None = None
    # Projection and LM-head weights: "fp32", "bf16" (rounded at load: half the bytes;
    # bf16 dot products with AVX512-BF16), "int8" (requantized at load, one scale
    # per output row; a quarter of the bytes a decode step streams), "w8a8" (int8 weights
    # and per-token int8 activations: int8 dot products), "blocks" (a GGUF's Q4_0 / Q4_1 /
    # Q5_0 / Q8_0 / Q4_K / Q6_K blocks kept as the file has them, int8 activations:
    # engine/quantization/block_weights.py; other tensors w8a8), or "auto" (per shape the
    # fastest of those but bf16 as a decode step streams them, measured:
    # engine/quantization/memory_roofline.py).
    weights: str = "fp32"
    # K/V pool element type: "fp32", "bf16" (half the bytes a token's K/V take, so twice
    # the tokens in kv_cache_bytes; rounded to nearest even when stored), or "int8" (fp32
    # scales per token and KV head kept in the page, K with an offset: 1.83x bf16's tokens
    # for SmolLM2; docs/engine.md).
    kv_dtype: str = "fp32"
