"""ModelRunner: owns the model, tokenizer and KV pools; runs one step over SeqChunks."""

import logging
from collections.abc import Callable

import torch

from engine.attention import build_context
from engine.batch import SeqChunk
from engine.config import KV_DTYPES, EngineConfig
from engine.cpu_features import cpu_features
from engine.fused_decode import FusedDecode
from engine.kv.pages import new_kv_pools, page_bytes
from engine.logits_process import adjust_logits
from engine.model_registry import resolve_model
from engine.models.config import ModelConfig
from engine.ops import NativeOps, select_ops
from engine.sampler import logprobs_of, sample
from engine.sampling_params import SamplingParams
from engine.structured_output.grammar import mask_logits
from engine.thread_choice import ROUNDS, choose_threads
from engine.tokenizer import load_tokenizer
from engine.weights import load_model

_DTYPE = torch.float32
_KV_TORCH_DTYPES = {"fp32": _DTYPE, "bf16": torch.bfloat16, "int8": torch.int8}  # KV_DTYPES
log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        if config.num_threads:  # before loading: auto-chosen kernels are timed at these
            torch.set_num_threads(config.num_threads)
        resolved = resolve_model(config.model)
        self.config = config
        self.model_name = resolved.name
        # the C kernels or torch, for the runner's whole life
        self.ops = select_ops(config.weights)
        self.model_config, self.model = load_model(resolved, self.ops)
        self.model.pack_weights(batch_hint=config.max_num_seqs)
        self.model.drop_plain_weights()
        self.tokenizer = load_tokenizer(resolved)
        self.page_size = config.page_size
        self.max_model_len = min(
            config.max_model_len or self.model_config.max_position,
            self.model_config.max_position,  # rope table and training length end here
        )
        if config.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, not {config.kv_dtype!r}")
        self.kv_dtype = _KV_TORCH_DTYPES[config.kv_dtype]
        self.num_pages = config.kv_cache_bytes // self.bytes_per_page(
            self.model_config, self.page_size, config.kv_dtype
        )
        if self.num_pages < 1:
            raise ValueError("kv_cache_bytes is smaller than one KV page")
        c = self.model_config
        self.kv_caches = [
            new_kv_pools(self.num_pages, self.page_size, c.num_kv_heads, c.head_dim, self.kv_dtype)
            for _ in range(c.num_layers)
        ]
        self._scratch = torch.empty(0)  # fused decode's, kept: a fresh one per step page-faults
        # fused decode's logits, kept for the same reason (32 x 151,936: ~0.8 ms of faults)
        self._logits = torch.empty(0, self.model_config.vocab_size)
        # decode-only steps in one C call (None: the model's forward runs every step)
        self.fused = FusedDecode.build(self.ops.kernels, self.model, self.kv_caches)
        self.threads = choose_threads(config.num_threads, self._decode_probe(ROUNDS))
        log.info(
            "%s: %s", self.model_name, " ".join(f"{k}={v}" for k, v in self.kernel_info().items())
        )

    def release(self) -> None:
        """Free the weights and KV pools now: a stopped engine's objects can outlive it in
        reference cycles until a full collection, and hold its gigabytes until then (a hot
        reload that retires an engine, a test session that starts many)."""
        self.fused = None
        self.kv_caches = []
        self.model = None  # type: ignore[assignment]
        self._scratch, self._logits = torch.empty(0), torch.empty(0)

    def kernel_info(self) -> dict[str, str]:
        """What runs this model: ops, weight format, fused decode, KV dtype, each format's kernel
        path and measured choices, CPU features."""
        info = {
            "ops": "native" if isinstance(self.ops, NativeOps) else "torch",
            "weights": self.config.weights,
            "fused_decode": str(self.fused is not None).lower(),
            "kv_dtype": self.config.kv_dtype,
            **self.threads.info(),
        }
        info |= self.ops.choice_info()  # each format's path, formats packed, measured choices
        return info | {k: str(v).lower() for k, v in cpu_features().items()}

    def _decode_probe(self, rounds: int, prompt: int = 16) -> Callable[[], None] | None:
        """One decode step of a few sequences as the engine runs them (fused decode where
        built), on KV pages nothing holds yet: what the thread choice times. None when the
        pool is too small for it."""
        steps = 2 * (rounds + 1)  # choose_threads' calls: each candidate, warm-up included
        per_seq = -(-(prompt + steps) // self.page_size)
        batch = min(8, self.config.max_num_seqs, self.num_pages // per_seq)
        if batch < 1 or prompt + steps > self.max_model_len:
            return None
        greedy = SamplingParams(temperature=0.0)
        tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
        ids = [i % self.model_config.vocab_size for i in range(100, 100 + prompt)]
        self.execute([SeqChunk(i, ids, 0, tables[i], True, greedy) for i in range(batch)])
        pos = [prompt]

        def step() -> None:
            p, pos[0] = pos[0], pos[0] + 1
            end = -(-(p + 1) // self.page_size)
            self.execute(
                [SeqChunk(i, ids[:1], p, t[:end], True, greedy) for i, t in enumerate(tables)]
            )

        return step

    @staticmethod
    def bytes_per_page(model_config: ModelConfig, page_size: int, kv_dtype: str = "fp32") -> int:
        """K and V of all layers for page_size tokens (int8: with their scales)."""
        c, dtype = model_config, _KV_TORCH_DTYPES[kv_dtype]
        return c.num_layers * page_bytes(page_size, c.num_kv_heads, c.head_dim, dtype)

    @torch.inference_mode()
    def execute(self, chunks: list[SeqChunk]) -> list[int | None]:
        """One forward over all chunks packed together; a token for each sample=True chunk."""
        if not chunks:
            return []
        if any(not c.token_ids for c in chunks):
            raise ValueError("a SeqChunk must carry at least one token")
        # prefills first, then decodes: the attention context wants them so
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].token_ids) == 1)
        ordered = [chunks[i] for i in order]
        input_ids, positions, last = self._pack(ordered)
        ctx = build_context(ordered, self.page_size, self.ops.kernels)
        want = [j for j, c in enumerate(ordered) if c.sample]
        results: list[int | None] = [None] * len(chunks)
        if self.fused is not None and len(input_ids) == len(ordered):  # decodes only
            b = len(ordered)
            if self._scratch.numel() < (n := self.fused.workspace_floats(b)):
                self._scratch = torch.empty(n, dtype=_DTYPE)
            if self._logits.shape[0] < b:
                self._logits = torch.empty(b, self._logits.shape[1], dtype=_DTYPE)
            rope = self.model.rotary(positions)
            logits = self.fused.logits(input_ids, rope, ctx, self._scratch, self._logits[:b])
            logits = logits if len(want) == len(ordered) else logits[want]
        else:
            hidden = self.model(input_ids, positions, ctx, self.kv_caches)
            logits = self.model.compute_logits(hidden[[last[j] for j in want]]) if want else None
        if want:
            tokens = self._sample([ordered[j] for j in want], logits)
            for j, token in zip(want, tokens, strict=True):
                results[order[j]] = token
        return results

    def _sample(self, chunks: list[SeqChunk], logits: torch.Tensor) -> list[int]:
        """A token for each chunk; its logprobs go into the chunk when its params ask."""
        params = [c.params for c in chunks]
        if any(p.adjusts_logits for p in params):
            histories = [c.history for c in chunks]
            logits = adjust_logits(logits, params, histories, self.tokenizer.eos_token_ids)
        if any(c.grammar is not None for c in chunks):
            mask_logits(logits, [c.grammar for c in chunks])
        tokens = sample(logits, params, [c.generator for c in chunks])
        logprobs = logprobs_of(logits, tokens, params)
        for c, lp in zip(chunks, logprobs, strict=True):
            c.logprobs = lp
        return tokens

    def _pack(self, chunks: list[SeqChunk]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        ids: list[int] = []
        pos: list[int] = []
        last: list[int] = []  # index of each chunk's last token in the packed batch
        for c in chunks:
            n = len(c.token_ids)
            if c.start_pos + n > self.max_model_len:
                raise ValueError(f"sequence {c.seq_id} exceeds max_model_len")
            ids.extend(c.token_ids)
            pos.extend(range(c.start_pos, c.start_pos + n))
            last.append(len(ids) - 1)
        return torch.tensor(ids), torch.tensor(pos), last
