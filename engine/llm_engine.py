"""LLMEngine: requests in, per-step output deltas out (AsyncEngine wraps it for asyncio)."""

import itertools
import time
import uuid
from typing import TYPE_CHECKING, Any

import torch

from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import PromptTooLongError, QueueFullError
from engine.kv import KVManager
from engine.metrics import EngineMetrics
from engine.model_registry import ModelNotFoundError, resolve_model
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence

if TYPE_CHECKING:
    from engine.runner import ModelRunner


def _model_name(config: EngineConfig, runner: Any) -> str:
    name = getattr(runner, "model_name", None)
    if name:
        return str(name)
    try:
        return resolve_model(config.model).name
    except ModelNotFoundError:
        return config.model


class LLMEngine:
    """Single-threaded: call add_request / abort_request / step from one thread only."""

    def __init__(self, config: EngineConfig, runner: "ModelRunner | None" = None) -> None:
        if runner is None:
            from engine.runner import ModelRunner  # lazy: loads torch models only when needed

            runner = ModelRunner(config)
        self.config = config
        self.runner = runner
        self.tokenizer = runner.tokenizer
        self.page_size: int = runner.page_size
        self.num_pages: int = runner.num_pages
        # One sequence must fit the pool on its own, or preemption could never make room.
        limits = [runner.max_model_len, self.num_pages * self.page_size, config.max_model_len]
        self.max_model_len: int = min(x for x in limits if x)
        self.model_name = _model_name(config, runner)
        self.metrics = EngineMetrics(self.model_name)
        self.kv = KVManager(self.num_pages, self.page_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.kv, self.metrics)
        self._eos = set(self.tokenizer.eos_token_ids)
        self._vocab_size: int | None = getattr(
            getattr(runner, "model_config", None), "vocab_size", None
        )
        self._seqs: dict[str, Sequence] = {}
        self._pending: list[RequestOutput] = []  # abort outputs, handed out by the next step()
        self._seq_ids = itertools.count()

    # -- requests -------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request; raises PromptTooLongError, QueueFullError or ValueError."""
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_prompt(ids)
        seq = Sequence(
            seq_id=next(self._seq_ids),
            request_id=request_id,
            token_ids=ids,
            num_prompt_tokens=len(ids),
            params=params,
            max_tokens=min(params.max_tokens, self.max_model_len - len(ids)),
            cache_salt=cache_salt,
            arrival_time=time.monotonic(),
            generator=None if params.seed is None else torch.Generator().manual_seed(params.seed),
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids, params.stop),
        )
        self.scheduler.add(seq)  # QueueFullError when the waiting queue is at its bound
        self._seqs[request_id] = seq

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) + 1 > self.max_model_len:
            raise PromptTooLongError(
                f"prompt has {len(ids)} tokens; the context is {self.max_model_len} tokens "
                "and at least one must be left for the output"
            )
        vocab = self._vocab_size
        if vocab is not None and not all(0 <= t < vocab for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")

    def abort_request(self, request_id: str) -> None:
        """Stop a request and free its pages now; the next step() reports it finished."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return
        self.scheduler.finish(seq, "abort")
        self._pending.append(self._output(seq, "", "abort"))

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending)

    def free_pages(self) -> int:
        """Pages free or holding only reusable cached content (== num_pages at rest)."""
        return self.kv.num_free()

    def reset_prefix_cache(self) -> None:
        """Forget every cached page no request holds (benchmarks: a cold cache on demand)."""
        self.kv.reset_prefix_cache()

    # -- the step loop ----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one batch; returns each request's new tokens and text from this step."""
        outputs, self._pending = self._pending, []
        scheduled = self.scheduler.schedule()
        if scheduled:
            sampled = self.runner.execute([chunk for _, chunk in scheduled])
            self.scheduler.on_executed(scheduled)
            now = time.monotonic()
            new_tokens = 0
            for (seq, chunk), token in zip(scheduled, sampled, strict=True):
                if chunk.sample and token is not None:
                    outputs.append(self._on_token(seq, token, now))
                    new_tokens += 1
            self.metrics.on_tokens(new_tokens)
        sched = self.scheduler
        self.metrics.on_step(len(sched.running), len(sched.waiting), self.kv.usage())
        return outputs

    def _on_token(self, seq: Sequence, token: int, now: float) -> RequestOutput:
        seq.token_ids.append(token)
        if seq.first_token_time is None:
            seq.first_token_time = now
            self.metrics.on_first_token(now - seq.arrival_time)
        else:
            self.metrics.on_inter_token(now - (seq.last_token_time or now))
        seq.last_token_time = now
        detok = seq.detokenizer
        assert detok is not None
        reason: str | None = None
        if token in seq.params.stop_token_ids or (not seq.params.ignore_eos and token in self._eos):
            reason, text = "stop", detok.flush()  # the stop token's own text is never shown
        else:
            text = detok.add(token)
            if detok.stopped:
                reason = "stop"
            elif seq.num_output_tokens >= seq.max_tokens:
                reason, text = "length", text + detok.flush()
        if reason is not None:
            self.scheduler.finish(seq, reason)
            del self._seqs[seq.request_id]
        return self._output(seq, text, reason)

    def _output(self, seq: Sequence, text: str, reason: str | None) -> RequestOutput:
        new_ids = seq.output_token_ids[seq.num_emitted_tokens :]
        seq.num_emitted_tokens = seq.num_output_tokens
        return RequestOutput(
            request_id=seq.request_id,
            text=text,
            token_ids=new_ids,
            finished=reason is not None,
            finish_reason=reason,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_tokens=seq.num_cached_tokens,
        )

    # -- offline convenience ----------------------------------------------------------------

    def generate(
        self,
        prompts: str | list[int] | list[str] | list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[str]:
        """Run prompts to completion and return their texts, in order (offline use, tests)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        tag = uuid.uuid4().hex[:8]
        ids = [f"generate-{tag}-{i}" for i in range(len(prompts))]
        todo = list(zip(ids, prompts, plist, strict=True))
        texts: dict[str, list[str]] = {rid: [] for rid in ids}
        left = set(ids)
        while left:
            while todo:  # queue what fits; the rest waits for room
                try:
                    self.add_request(*todo[0])  # type: ignore[arg-type]
                except QueueFullError:
                    break
                todo.pop(0)
            for out in self.step():
                if out.request_id in texts:
                    texts[out.request_id].append(out.text)
                    if out.finished:
                        left.discard(out.request_id)
        return ["".join(texts[rid]) for rid in ids]
