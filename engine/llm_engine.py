"""LLMEngine: requests in, per-step output deltas out (AsyncEngine wraps it for asyncio)."""

import dataclasses
import itertools
import logging
import time
import uuid
from typing import TYPE_CHECKING

import torch

from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import (
    CompletionTooLongError,
    InvalidParamError,
    PromptTooLongError,
    QueueFullError,
    TenantQueueFullError,
)
from engine.kv.kv_manager import KVManager
from engine.metrics import EngineMetrics
from engine.outputs import RequestOutput
from engine.sampler import SampledLogprobs
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduled, Scheduler
from engine.sequence import Sequence
from engine.structured_output.grammar import GrammarCompiler, GrammarState
from engine.token_names import TokenNames

if TYPE_CHECKING:
    from engine.runner import ModelRunner

log = logging.getLogger(__name__)

# A token is rarely longer than this many characters, so a prompt of more characters than
# this times the context cannot fit: it is refused without being tokenized at all.
MAX_CHARS_PER_TOKEN = 32
# Steps in a row in which every scheduled request failed: the model itself is broken, and
# the step loop gives up (the gateway restarts the engine) rather than fail requests forever.
_MAX_FAILED_STEPS = 3


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
        self.model_name: str = runner.model_name
        self.metrics = EngineMetrics(self.model_name)
        if hasattr(runner, "kernel_info"):  # test runners without kernels have none
            self.metrics.set_kernel_info(runner.kernel_info())
        self.kv = KVManager(self.num_pages, self.page_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.kv, self.metrics)
        self._eos = set(self.tokenizer.eos_token_ids)
        self._vocab_size: int = runner.model_config.vocab_size
        self._token_names = TokenNames(self.tokenizer)
        self.grammars = GrammarCompiler(self.tokenizer, self._vocab_size)  # compiles on first use
        self._seqs: dict[str, Sequence] = {}
        self._pending: list[RequestOutput] = []  # abort outputs, handed out by the next step()
        self._seq_ids = itertools.count()
        self._failed_steps = 0

    # -- requests -------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
        grammar: GrammarState | None = None,
        priority: int = 0,
    ) -> None:
        """Queue a request; raises PromptTooLongError, QueueFullError or ValueError.

        The cache salt stands for the tenant (the gateway sets it from the tenant), so it is
        also what `max_waiting_per_tenant` counts by. A constrained request's grammar is
        best compiled by the caller (`self.grammars.state_for`, off the step loop); without
        one it is compiled here. `priority`: lower is served first (0 interactive, 1 batch
        work, which is preempted first and never admitted ahead of interactive requests).
        """
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        self._check_tenant_share(cache_salt)
        if isinstance(prompt, str):
            self.check_prompt_chars(len(prompt))
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_prompt(ids)
        self._check_token_params(params)
        if params.constraint is not None and grammar is None:
            grammar = self.grammars.state_for(params.constraint)
        if params.top_k >= self._vocab_size:
            params = dataclasses.replace(params, top_k=0)  # no filter at all, and int64-safe
        seq = Sequence(
            seq_id=next(self._seq_ids),
            request_id=request_id,
            token_ids=ids,
            num_prompt_tokens=len(ids),
            params=params,
            max_tokens=min(params.max_tokens, self.max_model_len - len(ids)),
            cache_salt=cache_salt,
            priority=priority,
            arrival_time=time.monotonic(),
            generator=None if params.seed is None else torch.Generator().manual_seed(params.seed),
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids, params.stop),
            grammar=grammar,
        )
        self.scheduler.add(seq)  # QueueFullError when the waiting queue is at its bound
        self._seqs[request_id] = seq

    def _check_tenant_share(self, tenant: str | None) -> None:
        cap = self.config.max_waiting_per_tenant
        if cap is None:
            return
        # A scan, not a counter: the queue is short (max_waiting) and preemption re-queues.
        waiting = sum(1 for s in self.scheduler.waiting if s.cache_salt == tenant)
        if waiting >= cap:
            raise TenantQueueFullError(
                f"this tenant has {waiting} requests waiting, its share of the queue "
                f"(max_waiting_per_tenant={cap})"
            )

    def check_prompt_chars(self, num_chars: int) -> None:
        """Refuse a prompt far beyond the context before anyone tokenizes or templates it."""
        limit = self.max_model_len * MAX_CHARS_PER_TOKEN
        if num_chars > limit:
            raise PromptTooLongError(
                f"prompt has {num_chars} characters, far more than the context of "
                f"{self.max_model_len} tokens can hold (at most {limit} characters)"
            )

    def check_room(self, num_prompt_tokens: int, max_tokens: int | None = None) -> None:
        """Refuse a prompt that leaves no room for output, or a requested `max_tokens` the
        context cannot hold after it (OpenAI's and vLLM's 400; per choice, as `n` choices
        share the prompt). Without max_tokens the answer may run to the end of the context."""
        limit = self.max_model_len
        if num_prompt_tokens + 1 > limit:
            raise PromptTooLongError(
                f"prompt has {num_prompt_tokens} tokens; the context is {limit} tokens "
                "and at least one must be left for the output"
            )
        if max_tokens is not None and num_prompt_tokens + max_tokens > limit:
            raise CompletionTooLongError(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in "
                f"the prompt, {max_tokens} in the completion). Please reduce the length of "
                "the prompt or max_tokens."
            )

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("the prompt is empty")
        self.check_room(len(ids))
        vocab = self._vocab_size
        if not all(0 <= t < vocab for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")

    def _check_token_params(self, params: SamplingParams) -> None:
        vocab = self._vocab_size
        for name, ids in (
            ("logit_bias", params.logit_bias),
            ("stop_token_ids", params.stop_token_ids),
        ):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise InvalidParamError(name, f"{name}: token id {bad[0]} is not in [0, {vocab})")

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
        """Run one batch; returns each request's new tokens and text from this step.

        An exception that one request causes fails that request only (finish reason
        "error"); the step raises only when the engine itself looks broken.
        """
        outputs, self._pending = self._pending, []
        scheduled = self.scheduler.schedule()
        sampled, failed = self._execute(scheduled) if scheduled else ([], {})
        self.scheduler.on_executed([s for i, s in enumerate(scheduled) if i not in failed])
        now = time.monotonic()
        for i, ((seq, chunk), token) in enumerate(zip(scheduled, sampled, strict=True)):
            if i in failed:
                outputs.append(self._fail(seq, failed[i]))
            elif chunk.sample and token is not None:
                try:
                    outputs.append(self._on_token(seq, token, now, chunk.logprobs))
                except Exception as exc:  # e.g. the detokenizer on a token it cannot handle
                    outputs.append(self._fail(seq, exc))
        sched = self.scheduler
        self.metrics.on_step(len(sched.running), len(sched.waiting), self.kv.usage())
        return outputs

    def _execute(self, scheduled: Scheduled) -> tuple[list[int | None], dict[int, Exception]]:
        """Sampled tokens, and the exception of each chunk that failed (by batch index).

        When the batch fails, each chunk runs again alone to find the ones at fault; the
        others' KV slots are rewritten with the same values, so they lose nothing.
        """
        chunks = [chunk for _, chunk in scheduled]
        try:
            sampled, failed = self.runner.execute(chunks), {}
        except Exception as exc:
            log.warning("a batch of %d failed (%r); retrying each alone", len(chunks), exc)
            sampled, failed = [None] * len(chunks), {}
            for i, chunk in enumerate(chunks):
                try:
                    sampled[i] = self.runner.execute([chunk])[0]
                except Exception as alone:
                    failed[i] = alone
        self._failed_steps = self._failed_steps + 1 if len(failed) == len(chunks) else 0
        if self._failed_steps >= _MAX_FAILED_STEPS:
            raise next(iter(failed.values()))
        return sampled, failed

    def _fail(self, seq: Sequence, exc: Exception) -> RequestOutput:
        log.warning("request %s failed in the engine: %r", seq.request_id, exc)
        if seq.request_id in self._seqs:
            self.scheduler.finish(seq, "error")
            del self._seqs[seq.request_id]
        out = self._output(seq, "", "error")
        return dataclasses.replace(out, error=f"{type(exc).__name__}: {exc}")

    def _on_token(
        self, seq: Sequence, token: int, now: float, logprobs: SampledLogprobs | None
    ) -> RequestOutput:
        seq.token_ids.append(token)
        self.metrics.on_token()
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
            if logprobs is not None:  # a stop token has none, as it has no text
                seq.new_logprobs.append(self._token_names.named(logprobs))
            text = detok.add(token)
            if detok.stopped:
                reason = "stop"
            elif seq.grammar is not None and seq.grammar.accept(token):
                reason, text = "stop", text + detok.flush()  # the grammar is complete
            elif seq.num_output_tokens >= seq.max_tokens:
                reason, text = "length", text + detok.flush()
        if reason is not None:
            self.scheduler.finish(seq, reason)
            del self._seqs[seq.request_id]
        return self._output(seq, text, reason)

    def _output(self, seq: Sequence, text: str, reason: str | None) -> RequestOutput:
        new_ids = seq.output_token_ids[seq.num_emitted_tokens :]
        seq.num_emitted_tokens = seq.num_output_tokens
        logprobs = None
        if seq.params.logprobs is not None:
            logprobs, seq.new_logprobs = seq.new_logprobs, []
        return RequestOutput(
            request_id=seq.request_id,
            text=text,
            token_ids=new_ids,
            finished=reason is not None,
            finish_reason=reason,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_tokens=seq.num_cached_tokens,
            logprobs=logprobs,
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
